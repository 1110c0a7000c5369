"""Tiny char-level GPT trained with Lightning Fabric (DDP, 2 CPU ranks).

nanoGPT-style loop ported to Fabric: gradient accumulation over `grad_accum`
micro-batches with `no_backward_sync`, AdamW, cosine LR, grad-norm clipping.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class TrainConfig:
    vocab_size: int = 48
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2
    micro_batch: int = 4
    grad_accum: int = 4
    max_iters: int = 12
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 2
    grad_clip: float = 0.25
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))
        mask = torch.triu(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_lr(it, cfg):
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    ratio = (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def get_batch(data, cfg, gen):
    ix = torch.randint(len(data) - cfg.block_size - 1, (cfg.micro_batch,), generator=gen)
    x = torch.stack([data[i:i + cfg.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix])
    return x, y


def main():
    cfg = TrainConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", num_nodes=1)
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    corpus_gen = torch.Generator().manual_seed(7)
    data = torch.randint(cfg.vocab_size, (4096,), generator=corpus_gen)
    batch_gen = torch.Generator().manual_seed(100 + fabric.global_rank)

    model = TinyGPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1,
                                  betas=(0.9, 0.95))
    model, optimizer = fabric.setup(model, optimizer)
    assert fabric.world_size == 2

    for it in range(cfg.max_iters):
        lr = get_lr(it, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr
        for micro_step in range(cfg.grad_accum):
            x, y = get_batch(data, cfg, batch_gen)
            is_last = micro_step == cfg.grad_accum - 1
            with fabric.no_backward_sync(model, enabled=not is_last):
                loss = model(x, y) / cfg.grad_accum
                fabric.backward(loss)
            if cfg.grad_clip > 0:
                fabric.clip_gradients(model, optimizer, max_norm=cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % 4 == 0:
            fabric.print(f"iter {it} loss {loss.item() * cfg.grad_accum:.4f} lr {lr:.2e}")

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
