"""ZeRO-2 regression trainer: a small residual MLP fit with a DeepSpeed engine.

Config comes from a dataclass, turned into the DeepSpeed JSON by `TrainConfig.to_ds_config`.
"""
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed


@dataclass
class TrainConfig:
    micro_batch: int = 8
    grad_accum: int = 4
    lr: float = 2e-3
    momentum: float = 0.9
    weight_decay: float = 1e-4
    max_grad_norm: float = 10.0
    steps: int = 12
    hidden: int = 64
    in_dim: int = 16
    seed: int = 1234
    zero_stage: int = 2

    def to_ds_config(self, world):
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "train_batch_size": self.micro_batch * self.grad_accum * world,
            "gradient_clipping": self.max_grad_norm,
            "zero_optimization": {"stage": self.zero_stage, "overlap_comm": False,
                                  "contiguous_gradients": True},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
            "wall_clock_breakdown": False,
        }


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(cfg.in_dim, cfg.hidden)
        self.blocks = nn.Sequential(Block(cfg.hidden), Block(cfg.hidden))
        self.out = nn.Linear(cfg.hidden, 4)

    def forward(self, x, y):
        pred = self.out(self.blocks(self.inp(x)))
        return F.mse_loss(pred, y)


def make_data(cfg, world):
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.micro_batch * cfg.grad_accum * world * cfg.steps
    x = torch.randn(n, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, 4, generator=g) * 3.0
    y = x @ w + 0.1 * torch.randn(n, 4, generator=g)
    return x, y


class ZeroTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        model = Regressor(cfg)
        decay = [p for n, p in model.named_parameters() if p.dim() > 1]
        no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
        opt = torch.optim.SGD(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=cfg.to_ds_config(self.world))
        self.x, self.y = make_data(cfg, self.world)

    def micro_batches(self):
        mb = self.cfg.micro_batch
        # global micro-batch j covers rows [j*mb*W, (j+1)*mb*W); this rank takes its slice
        total = self.x.shape[0] // (mb * self.world)
        for j in range(total):
            lo = j * mb * self.world + self.rank * mb
            yield self.x[lo:lo + mb], self.y[lo:lo + mb]

    def train_step(self, xb, yb):
        loss = self.engine(xb, yb)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def fit(self):
        self.engine.train()
        for i, (xb, yb) in enumerate(self.micro_batches()):
            loss = self.train_step(xb, yb)
            if self.engine.is_gradient_accumulation_boundary() and self.rank == 0 and i % 16 == 15:
                print(f"micro {i} loss {loss.item():.4f}", flush=True)

    def final_hash(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = ZeroTrainer(TrainConfig())
    trainer.fit()
    digest = trainer.final_hash()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
