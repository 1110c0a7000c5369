"""Token classifier trained with FSDP2 (fully_shard) from a small trainer class.

Settings live in a dataclass; the LR follows linear warm-up then linear decay to zero.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


@dataclass
class TrainConfig:
    seed: int = 7
    vocab: int = 64
    dim: int = 32
    n_classes: int = 5
    seq_len: int = 12
    micro_batch: int = 4
    grad_accum: int = 3
    epochs: int = 2
    n_samples: int = 144
    lr: float = 3e-3
    warmup_frac: float = 0.2


class Tagger(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.block1 = nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, 2 * c.dim), nn.GELU(), nn.Linear(2 * c.dim, c.dim))
        self.block2 = nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, 2 * c.dim), nn.GELU(), nn.Linear(2 * c.dim, c.dim))
        self.head = nn.Linear(c.dim, c.n_classes)

    def forward(self, tok):
        h = self.emb(tok)
        h = h + self.block1(h)
        h = h + self.block2(h)
        return self.head(h)


class FSDPTrainer:
    def __init__(self, c: TrainConfig):
        self.c = c
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        model = Tagger(c)
        fully_shard(model.block1)
        fully_shard(model.block2)
        self.model = fully_shard(model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, weight_decay=0.01)
        self.loader = self._build_data()
        self.total_steps = c.epochs * len(self.loader)
        warm = max(1, int(c.warmup_frac * self.total_steps))
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (self.total_steps - s) / (self.total_steps - warm))
        )

    def _build_data(self):
        c = self.c
        g = torch.Generator().manual_seed(c.seed + 100)
        tok = torch.randint(0, c.vocab, (c.n_samples, c.seq_len), generator=g)
        lab = (tok % c.n_classes + (tok // 7) % 2) % c.n_classes
        idx = torch.arange(self.rank, c.n_samples, self.world)
        return [(tok[idx[i:i + c.micro_batch]], lab[idx[i:i + c.micro_batch]]) for i in range(0, len(idx), c.micro_batch)]

    def _loss(self, tok, lab):
        logits = self.model(tok)
        return nn.functional.cross_entropy(logits.reshape(-1, self.c.n_classes), lab.reshape(-1))

    def _optimizer_step(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        K = self.c.grad_accum
        for epoch in range(self.c.epochs):
            for i, (tok, lab) in enumerate(self.loader):
                last = (i + 1) % K == 0
                self.model.set_requires_gradient_sync(last)
                (self._loss(tok, lab) / K).backward()
                if last:
                    self._optimizer_step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    tr = FSDPTrainer(TrainConfig())
    tr.train()
    d = tr.digest()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()
