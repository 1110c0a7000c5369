"""FSDP2 (fully_shard) regression trainer with a deferred reduce-scatter, launched by torchrun."""
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


@dataclass
class Cfg:
    in_dim: int = 24
    hidden: int = 64
    n_blocks: int = 3
    micro_bs: int = 8
    accum: int = 4
    steps: int = 10
    lr: float = 2e-3
    seed: int = 11


class ResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.silu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.inp = nn.Linear(c.in_dim, c.hidden)
        self.blocks = nn.ModuleList([ResBlock(c.hidden) for _ in range(c.n_blocks)])
        self.out = nn.Linear(c.hidden, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).squeeze(-1)


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        model = Net(cfg)
        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.w_true = torch.randn(cfg.in_dim, generator=torch.Generator().manual_seed(3))

    def batch(self, step, micro):
        g = torch.Generator().manual_seed(10_000 * step + 100 * micro + self.rank)
        x = torch.randn(self.cfg.micro_bs, self.cfg.in_dim, generator=g)
        y = torch.tanh(x @ self.w_true) + 0.1 * torch.randn(self.cfg.micro_bs, generator=g)
        return x, y

    def compute_loss(self, x, y):
        return F.smooth_l1_loss(self.model(x), y, beta=0.5)

    def micro_step(self, step, micro):
        x, y = self.batch(step, micro)
        # only reduce-scatter once the window is complete
        self.model.set_requires_gradient_sync(micro == self.cfg.accum - 1)
        loss = self.compute_loss(x, y) / self.cfg.accum
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for step in range(self.cfg.steps):
            total = torch.zeros(())
            for micro in range(self.cfg.accum):
                total += self.micro_step(step, micro)
            self.optimizer_step()
            if self.rank == 0 and step % 3 == 0:
                print(f"step {step} loss {total.item():.5f}")

    def fingerprint(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    tr = Trainer(Cfg(), rank, world)
    tr.fit()
    digest = tr.fingerprint()
    if rank == 0:
        print("FINAL_SHA256", digest)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
