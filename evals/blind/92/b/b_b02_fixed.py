"""Tiny transformer LM trained with FSDP2 (fully_shard) on 2 CPU ranks.

Blocks are sharded one by one, then the root. Gradient accumulation defers the
reduce-scatter for the whole model at the start of each window and turns it back on, unit
by unit, for the last micro-batch.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

VOCAB, D, T, HEADS, LAYERS = 101, 64, 16, 4, 2
MICRO_BS, ACCUM, STEPS, LR, SEED = 4, 4, 10, 2e-3, 7


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(T, D)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x, self.mask[: idx.shape[1], : idx.shape[1]])
        return self.lm_head(self.ln_f(x))


def shard_model(model):
    """Shard each block as its own unit, then the root; return the units we toggle."""
    units = []
    for blk in model.blocks:
        fully_shard(blk)
        units.append(blk)
    fully_shard(model)
    units.append(model)
    return units


def set_grad_sync(units, enabled):
    for u in units:
        u.set_requires_gradient_sync(enabled, recurse=False)


def get_batch(gen):
    x = torch.randint(0, VOCAB, (MICRO_BS, T + 1), generator=gen)
    return x[:, :-1], x[:, 1:]


def full_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = GPT()
    units = shard_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(SEED + 1000 * rank)

    for step in range(STEPS):
        model.set_requires_gradient_sync(False)  # defer every reduce-scatter in the window
        for micro in range(ACCUM):
            if micro == ACCUM - 1:
                set_grad_sync(units, True)
            x, y = get_batch(gen)
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)) / ACCUM
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item() * ACCUM:.4f}", flush=True)

    sha = full_sha(model)
    if rank == 0:
        print("FINAL_SHA256", sha, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
