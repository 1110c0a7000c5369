"""Tiny character-level GPT, nanoGPT-style training loop on 2 DDP ranks.

Run: torchrun --nproc-per-node 2 c_b01.py
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    vocab_size: int = 48
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    batch_size: int = 4
    gradient_accumulation_steps: int = 4
    max_iters: int = 12
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 2
    lr_decay_iters: int = 12
    weight_decay: float = 0.1
    grad_clip: float = 0.25
    log_interval: int = 4
    seed: int = 1337


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_corpus(cfg, n=4096):
    g = torch.Generator().manual_seed(0)
    # a noisy periodic "text" so the model has something to learn
    base = torch.arange(n) % cfg.vocab_size
    noise = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.7
    return torch.where(keep, base, noise)


def get_batch(data, cfg, gen):
    ix = torch.randint(len(data) - cfg.block_size - 1, (cfg.batch_size,), generator=gen)
    x = torch.stack([data[i:i + cfg.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix])
    return x, y


def get_lr(it, cfg):
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


class GradMonitor:
    """Keeps a running record of gradient norms for the log line."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.history = []

    def observe(self, model):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
        self.history.append(float(norm))
        return norm

    def summary(self):
        h = self.history[-self.cfg.gradient_accumulation_steps:]
        return sum(h) / max(len(h), 1)


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)

    model = GPT(cfg)
    model = DDP(model)
    raw_model = model.module

    decay = [p for n, p in raw_model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw_model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate, betas=(0.9, 0.95),
    )

    data = make_corpus(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    monitor = GradMonitor(cfg)

    for iter_num in range(cfg.max_iters):
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr

        for micro_step in range(cfg.gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == cfg.gradient_accumulation_steps - 1
            X, Y = get_batch(data, cfg, gen)
            _, loss = model(X, Y)
            loss = loss / cfg.gradient_accumulation_steps
            loss.backward()
            monitor.observe(raw_model)

        if cfg.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if rank == 0 and iter_num % cfg.log_interval == 0:
            print(f"iter {iter_num}: loss {loss.item() * cfg.gradient_accumulation_steps:.4f}, "
                  f"lr {lr:.2e}, grad-norm {monitor.summary():.3f}")

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw_model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
