"""Accelerate fine-tuning of a small classifier, structured as a trainer class.

torchrun --nproc-per-node 2 ... b_b02.py   (Accelerator(cpu=True) joins the gloo group)
"""
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    seed: int = 7
    n_samples: int = 192
    in_dim: int = 24
    hidden: int = 64
    n_classes: int = 5
    micro_batch: int = 4
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    warmup_steps: int = 2


class MLPClassifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(), nn.LayerNorm(cfg.hidden),
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.n_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.n_classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class ClassifierTrainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
        assert self.accelerator.num_processes == 2, self.accelerator.num_processes
        set_seed(cfg.seed)
        self.model = MLPClassifier(cfg)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.train_loader = DataLoader(make_dataset(cfg), batch_size=cfg.micro_batch, shuffle=True,
                                       generator=torch.Generator().manual_seed(cfg.seed))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / (cfg.warmup_steps * self.accelerator.num_processes)))
        self.optimizer, self.train_loader, self.scheduler = self.accelerator.prepare(
            self.optimizer, self.train_loader, self.scheduler)
        self.model = self.accelerator.prepare_model(self.model)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits, y)

    def fit(self):
        self.model.train()
        for _ in range(self.cfg.epochs):
            for batch in self.train_loader:
                with self.accelerator.accumulate(self.model):
                    loss = self.training_step(batch)
                    self.accelerator.backward(loss)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad()

    def final_digest(self):
        model = self.accelerator.unwrap_model(self.model)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    trainer = ClassifierTrainer(Config())
    trainer.fit()
    digest = trainer.final_digest()
    if trainer.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}", flush=True)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
