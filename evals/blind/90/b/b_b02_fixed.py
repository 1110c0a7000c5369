# FSDP2 (fully_shard) training of a small MLP-mixer style model, 2 ranks via torchrun.
# Accumulation: gradient sync is switched off for all but the last micro-batch of a
# window; the loop is split over a small Trainer class.
import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    d_in: int = 24
    d_hidden: int = 64
    n_blocks: int = 3
    n_cls: int = 5
    micro_bs: int = 6
    accum: int = 3
    max_steps: int = 12
    lr: float = 3e-3
    warmup: int = 3


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.inp = nn.Linear(c.d_in, c.d_hidden)
        self.blocks = nn.ModuleList([Block(c.d_hidden) for _ in range(c.n_blocks)])
        self.head = nn.Linear(c.d_hidden, c.n_cls)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def lr_lambda(cfg):
    def f(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        prog = (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * prog))
    return f


class Trainer:
    def __init__(self, cfg, model, rank, world):
        self.cfg, self.model, self.rank, self.world = cfg, model, rank, world
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))

    def micro_step(self, x, y, last_in_window):
        self.model.set_requires_gradient_sync(last_in_window)
        logits = self.model(x)
        loss = nn.functional.cross_entropy(logits, y) / self.cfg.accum
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self, X, Y):
        c = self.cfg
        mb = 0
        for step in range(c.max_steps):
            for k in range(c.accum):
                sl = slice(mb * c.micro_bs, (mb + 1) * c.micro_bs)
                self.micro_step(X[sl], Y[sl], k == c.accum - 1)
                mb += 1
            self.optimizer_step()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = Cfg()
    torch.manual_seed(0)
    model = Net(cfg)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)

    g = torch.Generator().manual_seed(7)
    n = cfg.max_steps * cfg.accum * cfg.micro_bs * world
    W = torch.randn(cfg.d_in, cfg.n_cls, generator=g)
    X = torch.randn(n, cfg.d_in, generator=g)
    Y = (X @ W + 0.5 * torch.randn(n, cfg.n_cls, generator=g)).argmax(-1)
    X, Y = X[rank::world], Y[rank::world]

    Trainer(cfg, model, rank, world).fit(X, Y)

    flat = torch.cat([p.full_tensor().detach().float().reshape(-1) for _, p in model.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
