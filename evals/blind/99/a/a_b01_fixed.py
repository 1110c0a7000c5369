"""Tabular classifier trained with Lightning DDP and an accumulation warm-up.

The first epochs accumulate 4 batches per update (noisy early gradients), later
epochs 2. LR: linear warm-up then cosine decay over the whole run.
"""
import hashlib
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from pytorch_lightning.strategies import DDPStrategy


@dataclass
class RunConfig:
    n_samples: int = 96
    n_features: int = 24
    n_classes: int = 5
    batch_size: int = 4
    max_epochs: int = 4
    accumulation: dict = field(default_factory=lambda: {0: 4, 2: 2})
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 2
    seed: int = 1234


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.n_features, generator=g)
    w = torch.randn(cfg.n_features, cfg.n_classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def warmup_cosine(warmup, total):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return fn


class TabularClassifier(pl.LightningModule):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.cfg = cfg
        self.net = nn.Sequential(
            nn.Linear(cfg.n_features, 64), nn.GELU(),
            nn.Linear(64, 64), nn.GELU(),
            nn.Linear(64, cfg.n_classes),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        # number of optimizer updates in the run: the accumulation factor changes per epoch
        acc = next(c for c in self.trainer.callbacks if isinstance(c, GradientAccumulationScheduler))
        batches = self.trainer.estimated_stepping_batches // self.trainer.max_epochs  # factor still 1 here
        total_updates = sum(math.ceil(batches / acc.get_accumulate_grad_batches(e)) for e in range(self.trainer.max_epochs))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(self.cfg.warmup_steps, total_updates))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def params_sha256(module):
    h = hashlib.sha256()
    flat = []
    for _, p in module.named_parameters():
        t = p.detach().float().cpu().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if os.environ.get("A_DUMP"):
        torch.save(torch.cat(flat), os.environ["A_DUMP"])
    return h.hexdigest()


def main():
    cfg = RunConfig()
    pl.seed_everything(cfg.seed, workers=True)
    torch.use_deterministic_algorithms(True)
    loader = DataLoader(make_dataset(cfg), batch_size=cfg.batch_size, shuffle=False)
    model = TabularClassifier(cfg)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=cfg.max_epochs,
        callbacks=[GradientAccumulationScheduler(scheduling=cfg.accumulation)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
