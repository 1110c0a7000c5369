"""FSDP2 trainer with ranks of unequal micro-batch sizes (3 and 5 rows), a DataLoader worker,
per-sample loss sums over the window's all-ranks sample count x W, deferred sync, an acting clip."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    seed: int = 21
    dim: int = 32
    K: int = 4
    updates: int = 10
    lr: float = 1e-2
    clip: float = 0.25


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


class Regressor(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = Regressor(cfg.dim)
        for b in self.model.blocks:
            fully_shard(b)
        fully_shard(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        rows = 3 if self.rank == 0 else 5  # ranks see different micro-batch sizes
        g = torch.Generator().manual_seed(cfg.seed + self.rank)
        n = rows * cfg.K * cfg.updates
        x = torch.randn(n, 8, generator=g)
        y = torch.stack([x[:, :4].sum(1), (x[:, 4:] ** 2).sum(1)], 1)
        self.loader = DataLoader(TensorDataset(x, y), batch_size=rows, shuffle=False, num_workers=1)

    def window_count(self, window):
        n = torch.tensor(float(sum(xb.shape[0] for xb, _ in window)))
        dist.all_reduce(n)
        return n

    def fit(self):
        K = self.cfg.K
        it = iter(self.loader)
        for _ in range(self.cfg.updates):
            window = [next(it) for _ in range(K)]
            total = self.window_count(window)
            for j, (xb, yb) in enumerate(window):
                self.model.set_requires_gradient_sync(j == K - 1)
                loss = F.mse_loss(self.model(xb), yb, reduction="sum") * self.world / total
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
            self.opt.step()
            self.opt.zero_grad()

    def digest(self):
        flat = torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().reshape(-1)
                          for _, p in self.model.named_parameters()])
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    t = Trainer(Cfg())
    t.fit()
    d = t.digest()
    if t.rank == 0:
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
