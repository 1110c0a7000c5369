"""Regression trainer on a DeepSpeed engine (ZeRO stage 0) with hand-rolled accumulation.

The DeepSpeed config keeps gradient_accumulation_steps at 1 so the engine's
boundary logic stays out of the way; the loop accumulates by itself and skips
the gradient all-reduce on all but the last micro-batch with engine.no_sync().
"""
import hashlib
from contextlib import nullcontext
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RunConfig:
    in_features: int = 24
    hidden: int = 64
    out_features: int = 3
    micro_batch: int = 10
    accum_steps: int = 3
    windows: int = 12
    lr: float = 1e-2
    seed: int = 4242
    ds: dict = field(default_factory=lambda: {
        "train_micro_batch_size_per_gpu": 10,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0,
                                                   "torch_adam": True}},
        "steps_per_print": 100000,
    })


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(cfg.in_features, cfg.hidden), nn.SiLU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(),
        )
        self.head = nn.Linear(cfg.hidden, cfg.out_features)

    def forward(self, x):
        return self.head(self.body(x))


class HandAccumTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = Regressor(cfg)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg.ds)

    def data(self):
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed + 7)
        n = c.windows * c.accum_steps * self.world
        x = torch.randn(n, c.micro_batch, c.in_features, generator=g)
        w = torch.randn(c.in_features, c.out_features, generator=g)
        y = torch.sin(x @ w) + 0.1 * torch.randn(n, c.micro_batch, c.out_features, generator=g)
        return x[self.rank::self.world], y[self.rank::self.world]

    def micro_step(self, x, y, accumulate):
        ctx = self.engine.no_sync() if accumulate else nullcontext()
        with ctx:
            pred = self.engine(x)
            loss = F.mse_loss(pred, y) / self.cfg.accum_steps
            self.engine.backward(loss)
        if not accumulate:
            self.engine.step()
        return loss.detach()

    def fit(self):
        x, y = self.data()
        K = self.cfg.accum_steps
        for w in range(self.cfg.windows):
            total = 0.0
            for k in range(K):
                idx = w * K + k
                total += self.micro_step(x[idx], y[idx], accumulate=(k < K - 1)).item()
            if self.rank == 0 and w % 3 == 0:
                print(f"window {w} loss {total:.4f}")

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    trainer = HandAccumTrainer(RunConfig())
    trainer.fit()
    digest = trainer.sha()
    if trainer.rank == 0:
        print("FINAL_SHA256", digest)
