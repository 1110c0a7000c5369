"""Tabular classifier on a DeepSpeed ZeRO-2 engine, driven by a small trainer class.

Each epoch has 8 micro-batches per rank; windows are 3-3-2 (the engine's GA is 3 and the
trainer forces the boundary on the epoch's last micro-batch so nothing leaks into the next
epoch).
"""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RunConfig:
    seed: int = 1234
    micro_batch: int = 4
    grad_accum: int = 3
    micro_batches_per_epoch: int = 8
    epochs: int = 2
    lr: float = 3e-3
    n_features: int = 24
    n_classes: int = 5


def ds_config(cfg: RunConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class TabularNet(nn.Module):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.n_features, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, cfg.n_classes)

    def forward(self, x):
        return self.head(self.body(x))


class EngineTrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = TabularNet(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(cfg, self.world))
        g = torch.Generator().manual_seed(cfg.seed + 17)
        n = cfg.micro_batches_per_epoch * cfg.micro_batch * self.world
        self.x = torch.randn(n, cfg.n_features, generator=g)
        w = torch.randn(cfg.n_features, cfg.n_classes, generator=g)
        self.y = (self.x @ w + 0.3 * torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)

    def epoch_batches(self, epoch):
        g = torch.Generator().manual_seed(self.cfg.seed + 1000 + epoch)
        perm = torch.randperm(self.x.shape[0], generator=g)
        mine = perm[self.rank::self.world]
        mb = self.cfg.micro_batch
        return [(self.x[mine[i:i + mb]], self.y[mine[i:i + mb]]) for i in range(0, len(mine), mb)]

    def micro_step(self, xb, yb, is_last, window_len):
        self.engine.set_gradient_accumulation_boundary(is_last)
        logits = self.engine(xb)
        loss = F.cross_entropy(logits, yb)
        # the engine divides by its configured GA; a short window needs its own length
        self.engine.backward(loss / window_len, scale_wrt_gas=False)
        self.engine.step()
        return loss.item()

    def fit(self):
        K = self.cfg.grad_accum
        for epoch in range(self.cfg.epochs):
            batches = self.epoch_batches(epoch)
            for i, (xb, yb) in enumerate(batches):
                is_last = (i + 1) % K == 0 or i + 1 == len(batches)
                window_len = min(K, len(batches) - (i // K) * K)
                loss = self.micro_step(xb, yb, is_last, window_len)
            if self.rank == 0:
                print(f"epoch {epoch} last loss {loss:.4f} optimizer steps {self.engine.global_steps}", flush=True)

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    np.random.seed(0)
    trainer = EngineTrainer(RunConfig())
    trainer.fit()
    digest = trainer.final_sha()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
