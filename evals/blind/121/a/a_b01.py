"""Tabular regression trainer on DeepSpeed ZeRO-2 (2 ranks, CPU/gloo).

Settings live in a dataclass with HF-style names; the trainer turns them into the
DeepSpeed config.  We do not want gradient clipping for this model (max_grad_norm=0).
"""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class TrainArgs:
    seed: int = 1234
    per_device_batch_size: int = 8
    gradient_accumulation_steps: int = 4
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    max_grad_norm: float = 0.0      # 0 -> no clipping
    num_epochs: int = 3
    n_features: int = 16
    hidden: int = 64


def make_data(args, rank, world):
    g = torch.Generator().manual_seed(args.seed)
    n = 8 * args.per_device_batch_size * args.gradient_accumulation_steps * world
    x = torch.randn(n, args.n_features, generator=g)
    w = torch.randn(args.n_features, 1, generator=g) * 3.0
    y = x @ w + 5.0 + 0.1 * torch.randn(n, 1, generator=g)
    # contiguous shard per rank
    per = n // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


class Regressor(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, 1))

    def forward(self, x):
        return self.net(x)


class DSTrainer:
    def __init__(self, args: TrainArgs):
        self.args = args
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        model = Regressor(args.n_features, args.hidden)
        optim = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optim, config=self.ds_config())
        self.x, self.y = make_data(args, self.rank, self.world)

    def ds_config(self):
        a = self.args
        return {
            "train_micro_batch_size_per_gpu": a.per_device_batch_size,
            "gradient_accumulation_steps": a.gradient_accumulation_steps,
            "max_grad_norm": a.max_grad_norm,
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
        }

    def batches(self):
        bs = self.args.per_device_batch_size
        for i in range(0, len(self.x), bs):
            yield self.x[i:i + bs], self.y[i:i + bs]

    def training_step(self, xb, yb):
        pred = self.engine(xb)
        return nn.functional.mse_loss(pred, yb)

    def train(self):
        for epoch in range(self.args.num_epochs):
            for xb, yb in self.batches():
                loss = self.training_step(xb, yb)
                self.engine.backward(loss)
                self.engine.step()
        return self.engine.global_steps

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)
    trainer = DSTrainer(TrainArgs())
    steps = trainer.train()
    digest = trainer.final_digest()
    if trainer.rank == 0:
        print(f"optimizer steps: {steps}")
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
