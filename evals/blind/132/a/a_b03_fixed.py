"""FSDP2 (fully_shard) causal LM trainer with token-level loss.

Each optimizer step covers a window of K micro-batches, read ahead so the
window's number of target tokens is known before the first backward.
Gradient sync is deferred to the last micro-batch of the window.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

IGNORE = -100


@dataclass
class Cfg:
    vocab: int = 40
    dim: int = 32
    n_layers: int = 2
    max_len: int = 16
    micro_bsz: int = 4
    accum: int = 4
    steps: int = 10
    lr: float = 2e-3
    seed: int = 21


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Parameter(torch.zeros(c.max_len, c.dim))
        self.blocks = nn.ModuleList(Block(c.dim) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.size(1)]
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def rank_stream(c: Cfg, rank: int):
    """Padded sequences; rank 1 gets longer documents than rank 0."""
    g = torch.Generator().manual_seed(c.seed * 100 + rank)
    lo, hi = (3, 8) if rank == 0 else (8, c.max_len + 1)
    while True:
        ids = torch.zeros(c.micro_bsz, c.max_len, dtype=torch.long)
        labels = torch.full((c.micro_bsz, c.max_len), IGNORE, dtype=torch.long)
        for i in range(c.micro_bsz):
            n = int(torch.randint(lo, hi, (1,), generator=g))
            seq = torch.randint(1, c.vocab, (n,), generator=g)
            seq[1:] = (seq[:-1] * 7 + 3) % c.vocab   # learnable pattern
            ids[i, :n] = seq
            labels[i, : n - 1] = seq[1:]
        yield {"input_ids": ids, "labels": labels}


class FSDPTrainer:
    def __init__(self, c: Cfg):
        self.c = c
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        model = TinyLM(c)
        mesh = init_device_mesh("cpu", (self.world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.0)
        self.data = rank_stream(c, self.rank)

    def read_window(self):
        return [next(self.data) for _ in range(self.c.accum)]

    def token_denominator(self, window):
        n_local = sum((b["labels"] != IGNORE).sum() for b in window).float()
        n_global = n_local.clone()
        dist.all_reduce(n_global)
        # FSDP averages gradients over ranks, so each rank divides by its
        # share of the window's target tokens
        return n_global / self.world

    def train_step(self):
        window = self.read_window()
        denom = self.token_denominator(window)
        for i, batch in enumerate(window):
            self.model.set_requires_gradient_sync(i == len(window) - 1)
            logits = self.model(batch["input_ids"])
            tok_loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                       ignore_index=IGNORE, reduction="sum")
            (tok_loss / denom).backward()
        self.opt.step()
        self.opt.zero_grad()

    def fit(self):
        for _ in range(self.c.steps):
            self.train_step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    tr = FSDPTrainer(Cfg())
    tr.fit()
    d = tr.digest()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
