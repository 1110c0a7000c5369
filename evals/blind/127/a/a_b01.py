"""DDP classifier trainer: the 1/K accumulation factor is applied to the
gradients by parameter hooks, so the loss that is logged stays the true
per-batch mean (no `loss / K` sprinkled through the loop)."""
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    seed: int = 1234
    in_dim: int = 24
    hidden: int = 64
    n_classes: int = 6
    micro_batch: int = 8
    grad_accum: int = 4
    optimizer_steps: int = 10
    lr: float = 2e-3
    weight_decay: float = 0.01


class MLPClassifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(),
        )
        self.head = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, x):
        return self.head(self.net(x))


class ClassifierTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = MLPClassifier(cfg)
        self.model = DDP(model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self._install_grad_scaling()
        self._make_data()

    # ---- gradient scaling -------------------------------------------------
    def _install_grad_scaling(self):
        for p in self.model.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._scale_grad)

    def _scale_grad(self, param):
        param.grad.div_(self.cfg.grad_accum)

    # ---- data -------------------------------------------------------------
    def _make_data(self):
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed + 1)
        n_micro = cfg.optimizer_steps * cfg.grad_accum * self.world
        w_true = torch.randn(cfg.in_dim, cfg.n_classes, generator=g)
        x = torch.randn(n_micro, cfg.micro_batch, cfg.in_dim, generator=g)
        y = (x @ w_true + 0.5 * torch.randn(n_micro, cfg.micro_batch, cfg.n_classes, generator=g)).argmax(-1)
        # rank r takes micro-batches r, r + W, r + 2W, ...
        self.x = x[self.rank::self.world]
        self.y = y[self.rank::self.world]

    # ---- loop -------------------------------------------------------------
    def micro_step(self, i):
        is_last = (i + 1) % self.cfg.grad_accum == 0
        ctx = self.model.no_sync() if not is_last else _nullctx()
        with ctx:
            logits = self.model(self.x[i])
            loss = F.cross_entropy(logits, self.y[i])
            loss.backward()
        return loss.detach(), is_last

    def fit(self):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(self.x.shape[0]):
            loss, boundary = self.micro_step(i)
            if boundary:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                step = (i + 1) // self.cfg.grad_accum
                if self.rank == 0 and step % 5 == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)

    def final_hash(self):
        flat = torch.cat([p.detach().float().reshape(-1)
                          for _, p in self.model.module.named_parameters()])
        return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    torch.use_deterministic_algorithms(True)
    trainer = ClassifierTrainer(TrainConfig())
    trainer.fit()
    h = trainer.final_hash()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {h}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
