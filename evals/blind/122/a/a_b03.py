"""Tiny MLP-mixer style regressor on FSDP2 (fully_shard) with gradient accumulation.

Every FSDP unit gets its reduction divide factor from the config; the window is
accumulated with the reduce-scatter deferred to the last micro-step.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard


@dataclass
class TrainConfig:
    seed: int = 99
    d_model: int = 32
    n_blocks: int = 3
    micro_bs: int = 10
    accum_steps: int = 4
    optimizer_steps: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1")))

    @property
    def grad_divide_factor(self) -> float:
        # gradients averaged over every micro-batch in the global window
        return float(self.world_size * self.accum_steps)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(8, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.n_blocks))
        self.out = nn.Linear(cfg.d_model, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).squeeze(-1)


class FSDPTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        mesh = init_device_mesh("cpu", (cfg.world_size,))
        torch.manual_seed(cfg.seed)
        model = Regressor(cfg)
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(cfg.grad_divide_factor)
                m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    def batches(self):
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed + 3)
        n = c.optimizer_steps * c.accum_steps * c.world_size * c.micro_bs
        x = torch.randn(n, 8, generator=g)
        y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.1 * torch.randn(n, generator=g)
        x, y = x[self.rank::c.world_size], y[self.rank::c.world_size]
        for i in range(0, x.shape[0], c.micro_bs):
            yield x[i:i + c.micro_bs], y[i:i + c.micro_bs]

    def train_step(self, micro_batches):
        K = len(micro_batches)
        for j, (x, y) in enumerate(micro_batches):
            self.model.set_requires_gradient_sync(j == K - 1)
            loss = nn.functional.mse_loss(self.model(x), y) / K
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def fit(self):
        window = []
        for mb in self.batches():
            window.append(mb)
            if len(window) == self.cfg.accum_steps:
                self.train_step(window)
                window = []

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    trainer = FSDPTrainer(TrainConfig())
    trainer.fit()
    sha = trainer.final_sha()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
