"""Tabular intent classifier, Lightning DDP on 2 ranks with gradient accumulation.

The two ranks read shards of different micro-batch sizes (3 and 5 rows), so the
loss is normalised by the mean per-rank row count: DDP then averages the ranks'
gradients and the result is the mean over every row of the window.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class RunConfig:
    n_features: int = 24
    n_classes: int = 6
    hidden: int = 48
    rows_per_rank: tuple = (3, 5)
    batches_per_epoch: int = 8
    accumulate: int = 4
    epochs: int = 3
    lr: float = 3e-3
    seed: int = 1234


def make_shard(cfg: RunConfig, rank: int) -> TensorDataset:
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    n = cfg.rows_per_rank[rank] * cfg.batches_per_epoch
    x = torch.randn(n, cfg.n_features, generator=g)
    w = torch.randn(cfg.n_features, cfg.n_classes, generator=torch.Generator().manual_seed(7))
    logits = x @ w + 0.5 * rank  # the shards are not identically distributed
    y = logits.argmax(-1)
    return TensorDataset(x, y)


class IntentClassifier(pl.LightningModule):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.cfg = cfg
        self.net = nn.Sequential(
            nn.Linear(cfg.n_features, cfg.hidden),
            nn.GELU(),
            nn.Linear(cfg.hidden, cfg.hidden),
            nn.GELU(),
            nn.Linear(cfg.hidden, cfg.n_classes),
        )

    def forward(self, x):
        return self.net(x)

    def _mean_rows_per_rank(self, n_rows: int):
        # average micro-batch size over the ranks; DDP's gradient average then
        # turns sum / mean_rows into the global per-row mean
        return self.trainer.strategy.reduce(float(n_rows))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss_sum = F.cross_entropy(self(x), y, reduction="sum")
        loss = loss_sum / self._mean_rows_per_rank(y.numel())
        self.log("train_loss", loss.detach(), prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=0.0)

    def train_dataloader(self):
        shard = make_shard(self.cfg, self.global_rank)
        return DataLoader(shard, batch_size=self.cfg.rows_per_rank[self.global_rank], shuffle=False)


def params_sha256(module: nn.Module) -> str:
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in module.named_parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    cfg = RunConfig()
    pl.seed_everything(cfg.seed, workers=True)
    model = IntentClassifier(cfg)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=cfg.epochs,
        accumulate_grad_batches=cfg.accumulate,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
