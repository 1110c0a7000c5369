"""nanoGPT-style pretraining loop with a gradient-spike guard.

torchrun, 2 ranks, DDP with no_sync on all but the last micro-step of a window.
A window whose (pre-clip) gradient norm jumps above `spike_factor` x the running
norm average is skipped instead of applied (bad shards happen).
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2
    batch_size: int = 4
    gradient_accumulation_steps: int = 4
    max_iters: int = 24
    learning_rate: float = 6e-3
    min_lr: float = 3e-4
    warmup_iters: int = 3
    grad_clip: float = 1.0
    spike_factor: float = 2.0
    spike_warmup: int = 4
    bad_shard_iter: int = 14
    seed: int = 1337


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(c.block_size, c.block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class Shards:
    """Synthetic token stream: x[t+1] = (3 x[t] + 1) mod V. One shard is all padding."""

    def __init__(self, cfg, rank):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(cfg.seed + 1000 * rank)

    def get_batch(self, it):
        c = self.cfg
        n = c.block_size + 1
        if it == c.bad_shard_iter:
            seq = torch.zeros(c.batch_size, n, dtype=torch.long)  # a shard of padding
        else:
            start = torch.randint(0, c.vocab_size, (c.batch_size, 1), generator=self.g)
            seq = [start]
            for _ in range(n - 1):
                seq.append((3 * seq[-1] + 1) % c.vocab_size)
            seq = torch.cat(seq, 1)
        return seq[:, :-1], seq[:, 1:]


def get_lr(cfg, it):
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    ratio = (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    raw = TinyGPT(cfg)
    model = DDP(raw)
    opt = torch.optim.AdamW(raw.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    data = Shards(cfg, rank)
    K = cfg.gradient_accumulation_steps

    norm_avg = None
    skipped = 0
    for it in range(cfg.max_iters):
        lr = get_lr(cfg, it)
        for g in opt.param_groups:
            g["lr"] = lr

        for micro in range(K):
            X, Y = data.get_batch(it)
            ctx = model.no_sync() if micro < K - 1 else nullcontext()
            with ctx:
                loss = model(X, Y) / K
                loss.backward()

        norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip).item()
        if it >= cfg.spike_warmup and norm > cfg.spike_factor * norm_avg:
            skipped += 1
            if rank == 0:
                print(f"iter {it}: grad norm {norm:.3f} > {cfg.spike_factor} x {norm_avg:.3f}, skipping update", flush=True)
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
            norm_avg = norm if norm_avg is None else 0.8 * norm_avg + 0.2 * norm

        if rank == 0 and it % 6 == 0:
            print(f"iter {it} loss {loss.item() * K:.4f} norm {norm:.3f} lr {lr:.2e}", flush=True)

    if rank == 0:
        print(f"skipped {skipped} window(s)", flush=True)
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
