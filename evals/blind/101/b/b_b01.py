"""Regression fine-tune on a DeepSpeed ZeRO-1 engine (2 ranks, CPU/gloo).

Ported from a plain PyTorch loop: the trainer keeps the familiar
zero_grad / backward / step rhythm and lets the engine handle accumulation.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.distributed as dist
import deepspeed


@dataclass
class TrainConfig:
    micro_batch: int = 4
    grad_accum: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.01
    max_steps: int = 8
    seed: int = 1234
    zero_stage: int = 1


class TabularNet(nn.Module):
    def __init__(self, d_in=24, d_hidden=64, d_out=3):
        super().__init__()
        self.inp = nn.Linear(d_in, d_hidden)
        self.body = nn.Sequential(nn.GELU(), nn.Linear(d_hidden, d_hidden), nn.GELU())
        self.out = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.out(self.body(self.inp(x)))


def make_shard(rank, n, seed):
    g = torch.Generator().manual_seed(seed + 17 * rank)
    x = torch.randn(n, 24, generator=g)
    w = torch.randn(24, 3, generator=torch.Generator().manual_seed(seed))
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 3, generator=g)
    return x, y


def ds_config(cfg: TrainConfig, world):
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": cfg.zero_stage},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = TabularNet()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=ds_config(cfg, self.world)
        )
        n = cfg.micro_batch * cfg.grad_accum * cfg.max_steps
        self.x, self.y = make_shard(self.rank, n, cfg.seed)
        self.loss_fn = nn.MSELoss()

    def micro_batches(self):
        mb = self.cfg.micro_batch
        for i in range(0, self.x.shape[0], mb):
            yield self.x[i:i + mb], self.y[i:i + mb]

    def _micro_step(self, xb, yb):
        self.engine.zero_grad()
        loss = self.loss_fn(self.engine(xb), yb)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def fit(self):
        self.engine.train()
        for i, (xb, yb) in enumerate(self.micro_batches()):
            loss = self._micro_step(xb, yb)
            if self.rank == 0 and (i + 1) % 8 == 0:
                print(f"micro {i + 1} opt_step {self.engine.global_steps} loss {loss.item():.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    args, _ = ap.parse_known_args()
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = Trainer(TrainConfig())
    trainer.fit()
    dg = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {dg}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
