"""Regression head trained with a DeepSpeed engine (plain data parallel, ZeRO stage 0).

The engine owns gradient accumulation (gradient_accumulation_steps in the config) and
clears gradients itself after each boundary step.
"""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class RunConfig:
    micro_batch: int = 8
    grad_accum: int = 4
    optimizer_steps: int = 12
    lr: float = 3e-3
    in_dim: int = 24
    hidden: int = 48
    seed: int = 1234


def ds_config(cfg: RunConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class Regressor(nn.Module):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(),
        )
        self.head = nn.Linear(cfg.hidden, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make_data(cfg: RunConfig, rank: int, world: int):
    g = torch.Generator().manual_seed(cfg.seed + 17)
    n = cfg.micro_batch * cfg.grad_accum * world * cfg.optimizer_steps
    x = torch.randn(n, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, generator=g)
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(cfg.micro_batch), y.split(cfg.micro_batch)))


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = Regressor(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=ds_config(cfg, self.world))
        self.loss_fn = nn.MSELoss()

    def training_step(self, batch):
        x, y = batch
        loss = self.loss_fn(self.engine(x), y)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def fit(self):
        for batch in make_data(self.cfg, self.rank, self.world):
            self.training_step(batch)
        assert self.engine.global_steps == self.cfg.optimizer_steps

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = Trainer(RunConfig())
    trainer.fit()
    digest = trainer.final_digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
