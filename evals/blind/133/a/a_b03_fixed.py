"""Packed-sequence LM pre-training with FSDP2 (fully_shard) on a 1-D mesh.

Objective: the mean token loss over the global batch (all micro-batches of the
accumulation window, on all ranks), i.e. every non-pad target counts once.
Each rank reads a whole accumulation window up front.
"""
import hashlib
import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Settings:
    vocab: int = 96
    d_model: int = 32
    n_layers: int = 2
    seq_len: int = 24
    micro_batch: int = 3
    accum: int = 4
    steps: int = 10
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 2024
    betas: tuple = field(default=(0.9, 0.95))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h):
        return h + self.ff(self.ln(h))


class LM(nn.Module):
    def __init__(self, s: Settings):
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.d_model)
        self.pos = nn.Parameter(torch.zeros(s.seq_len, s.d_model))
        self.blocks = nn.ModuleList(Block(s.d_model) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.d_model)
        self.out = nn.Linear(s.d_model, s.vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.size(1)]
        for b in self.blocks:
            h = b(h)
        return self.out(self.ln_f(h))


def window_stream(s: Settings, rank: int):
    """Yields lists of `accum` micro-batches; documents are packed with padding
    at the end, so every micro-batch has a different number of targets."""
    g = torch.Generator().manual_seed(s.seed * 31 + rank)
    while True:
        window = []
        for _ in range(s.accum):
            ids = torch.randint(1, s.vocab, (s.micro_batch, s.seq_len), generator=g)
            fill = torch.randint(2, s.seq_len + 1, (s.micro_batch,), generator=g)
            mask = torch.arange(s.seq_len)[None, :] < fill[:, None]
            ids = ids * mask
            tgt = torch.full_like(ids, -100)
            tgt[:, :-1] = torch.where(mask[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], -100))
            window.append((ids, tgt))
        yield window


def count_targets(tgt):
    n = (tgt != -100).sum().to(torch.float32)
    dist.all_reduce(n, op=dist.ReduceOp.SUM)
    return n


def lm_loss(model, ids, tgt, world, n_all):
    logits = model(ids)
    total = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-100, reduction="sum")
    # normalise by the window's targets on all ranks; FSDP averages the gradients, x world undoes it
    return total * world / n_all


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    s = Settings()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(s.seed)
    model = LM(s)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay)

    stream = window_stream(s, rank)
    for step in range(s.steps):
        window = next(stream)
        n_window = count_targets(torch.stack([t for _, t in window]))
        for k, (ids, tgt) in enumerate(window):
            model.set_requires_gradient_sync(k == len(window) - 1)
            loss = lm_loss(model, ids, tgt, world, n_window)
            loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    digest = sha_of(model)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
