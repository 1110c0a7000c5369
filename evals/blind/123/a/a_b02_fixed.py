"""Dual-encoder (query/document) similarity regression on 2 DDP ranks.

A small trainer class: K micro-batches per optimizer step, DDP's no_sync() on all but
the last micro-batch of the window, loss divided by K.
"""
import hashlib
import os
import random
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


SETTINGS = dict(
    vocab=100,
    dim=32,
    seq=12,
    micro_batch=8,
    accum=4,
    steps=12,
    lr=5e-3,
    seed=7,
)


class TowerEncoder(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.proj = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def encode(self, ids):
        h = self.tok(ids).mean(dim=1)
        return F.normalize(self.proj(h), dim=-1)

    def forward(self, q_ids, d_ids):
        return self.encode(q_ids), self.encode(d_ids)


def synthetic_pairs(n, s, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, s["vocab"], (n, s["seq"]), generator=g)
    d = torch.randint(0, s["vocab"], (n, s["seq"]), generator=g)
    label = torch.rand(n, generator=g) * 2 - 1
    return q, d, label


class PairTrainer:
    def __init__(self, settings):
        self.s = settings
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(self.s["seed"])
        self.model = DDP(TowerEncoder(self.s["vocab"], self.s["dim"]))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.s["lr"], momentum=0.9)
        n_per_rank = self.s["micro_batch"] * self.s["accum"] * self.s["steps"]
        self.q, self.d, self.y = synthetic_pairs(n_per_rank, self.s, seed=1000 + self.rank)

    def micro_batches(self):
        mb = self.s["micro_batch"]
        for i in range(0, self.q.size(0), mb):
            yield self.q[i:i + mb], self.d[i:i + mb], self.y[i:i + mb]

    def embed_pair(self, q, d):
        return self.model(q, d)

    def compute_loss(self, q, d, y):
        qe, de = self.embed_pair(q, d)
        score = (qe * de).sum(-1)
        return F.mse_loss(score, y)

    def train(self):
        K = self.s["accum"]
        self.opt.zero_grad(set_to_none=True)
        for i, (q, d, y) in enumerate(self.micro_batches()):
            boundary = (i + 1) % K == 0
            ctx = nullcontext() if boundary else self.model.no_sync()
            with ctx:
                loss = self.compute_loss(q, d, y) / K
                loss.backward()
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                if self.rank == 0 and ((i + 1) // K) % 4 == 0:
                    print(f"step {(i + 1) // K} loss {loss.item() * K:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    random.seed(0)
    torch.use_deterministic_algorithms(True)
    trainer = PairTrainer(SETTINGS)
    trainer.train()
    hexd = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {hexd}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
