"""Tiny causal LM on packed, partially masked sequences with FSDP2 (fully_shard).

Objective: token-level cross entropy, averaged over every supervised token of the
optimizer step (all micro-batches of the window, all ranks).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

IGNORE = -100


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=24)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.dim)
        self.blocks = nn.ModuleList([Block(a.dim) for _ in range(a.layers)])
        self.norm = nn.LayerNorm(a.dim)
        self.out = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.out(self.norm(h))


def synthetic_batches(a, rank, world):
    """Each rank gets its own stream; the prompt part of every row is masked out,
    with prompt lengths that vary a lot from row to row."""
    g = torch.Generator().manual_seed(a.seed * 1000 + rank)
    n = a.steps * a.accum
    for _ in range(n):
        ids = torch.randint(0, a.vocab, (a.micro_bs, a.seq + 1), generator=g)
        labels = ids[:, 1:].clone()
        prompt = torch.randint(1, a.seq - 1, (a.micro_bs,), generator=g)
        cols = torch.arange(a.seq).unsqueeze(0)
        labels[cols < prompt.unsqueeze(1)] = IGNORE
        yield ids[:, :-1], labels


def micro_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def main():
    a = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    model = TinyLM(a)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)

    data = synthetic_batches(a, rank, world)
    for step in range(a.steps):
        window = [next(data) for _ in range(a.accum)]
        for i, (ids, labels) in enumerate(window):
            model.set_requires_gradient_sync(i == a.accum - 1)
            loss = micro_loss(model(ids), labels) / a.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
