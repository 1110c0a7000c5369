"""ZeRO-2 DeepSpeed trainer driven by a dataclass config.

The DeepSpeed JSON is generated from ``TrainConfig`` so that one dataclass is
the single source of truth; unset options are left out and fall back to
DeepSpeed's own defaults. The client scheduler is handed to the engine, which
advances it once per optimizer update.
"""
import argparse
import hashlib
import math
from dataclasses import dataclass, asdict
from typing import Optional

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class TrainConfig:
    micro_batch_size: int = 6
    grad_accum: int = 3
    max_grad_norm: float = 0.0          # 0 disables clipping
    zero_stage: int = 2
    lr: float = 1e-2
    weight_decay: float = 0.05
    epochs: int = 2
    n_samples: int = 288
    log_every: Optional[int] = None
    wall_clock_breakdown: bool = False

    def to_ds_config(self):
        full = {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_clipping": self.max_grad_norm,
            "zero_optimization": {"stage": self.zero_stage, "contiguous_gradients": True},
            "steps_per_print": self.log_every,
            "wall_clock_breakdown": self.wall_clock_breakdown,
        }
        # leave unset options to DeepSpeed's defaults
        return {k: v for k, v in full.items() if v is not None}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 48)
        self.mid = nn.Sequential(nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(self.mid(self.embed(x)))


def build_optimizer(model, cfg):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if n.endswith("bias") else decay).append(p)
    return torch.optim.AdamW([
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ], lr=cfg.lr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    args = parser.parse_args()
    cfg = TrainConfig(epochs=args.epochs)

    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(cfg.n_samples, 16, generator=g)
    y = 8.0 * torch.stack([x[:, 0] * x[:, 1], x[:, 2].abs(), x[:, 3:6].sum(-1)], -1)
    ds = TensorDataset(x, y)

    model = Model()
    opt = build_optimizer(model, cfg)
    updates = cfg.epochs * cfg.n_samples // (cfg.micro_batch_size * cfg.grad_accum * world)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, updates) / updates)))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=cfg.to_ds_config())

    sampler = DistributedSampler(ds, shuffle=True, seed=11)
    loader = DataLoader(ds, batch_size=cfg.micro_batch_size, sampler=sampler)
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()

    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
