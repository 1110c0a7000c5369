"""ZeRO-2 fine-tuning of a small regression MLP, driven by a JSON-like config dict.

The trainer class was ported from a plain PyTorch loop; DeepSpeed handles accumulation.
"""
import hashlib
import os

import deepspeed
import numpy as np
import torch
import torch.nn as nn

CONFIG = {
    "seed": 1234,
    "micro_batch": 4,
    "grad_accum": 2,
    "lr": 0.05,
    "epochs": 2,
    "n_samples": 96,
}


def ds_config(cfg, world):
    return {
        "train_micro_batch_size_per_gpu": cfg["micro_batch"],
        "gradient_accumulation_steps": cfg["grad_accum"],
        "train_batch_size": cfg["micro_batch"] * cfg["grad_accum"] * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "SGD", "params": {"lr": cfg["lr"], "momentum": 0.9}},
        "steps_per_print": 10_000,
    }


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class ZeroTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(cfg["seed"])
        model = Regressor()
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config(cfg, self.world)
        )
        g = torch.Generator().manual_seed(cfg["seed"] + 1)
        self.x = torch.randn(cfg["n_samples"], 16, generator=g)
        self.y = torch.sin(self.x.sum(-1)) + 0.1 * torch.randn(cfg["n_samples"], generator=g)

    def shard(self):
        idx = torch.arange(self.rank, self.cfg["n_samples"], self.world)
        mb = self.cfg["micro_batch"]
        return [(self.x[idx[i:i + mb]], self.y[idx[i:i + mb]]) for i in range(0, len(idx), mb)]

    def micro_step(self, xb, yb):
        pred = self.engine(xb)
        loss = nn.functional.mse_loss(pred, yb)
        self.engine.backward(loss)
        return loss.item()

    def fit(self):
        K = self.cfg["grad_accum"]
        for epoch in range(self.cfg["epochs"]):
            for i, (xb, yb) in enumerate(self.shard()):
                self.micro_step(xb, yb)
                self.engine.step()  # DeepSpeed only steps the optimizer at its own GA boundary

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = ZeroTrainer(CONFIG)
    t.fit()
    if t.rank == 0:
        print(f"FINAL_SHA256 {t.digest()}", flush=True)
