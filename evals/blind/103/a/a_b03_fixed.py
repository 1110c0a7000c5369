"""Lightning regression model on 2 DDP ranks; gradient accumulation comes from
a GradientAccumulationScheduler callback built from the experiment config."""
import hashlib
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class ExpConfig:
    seed: int = 7
    in_dim: int = 16
    hidden: int = 48
    batch_size: int = 6
    grad_accum: int = 3
    max_epochs: int = 2
    n_samples: int = 144        # 72 per rank -> 12 micro-batches -> 4 updates per epoch
    lr: float = 5e-3


class Regressor(pl.LightningModule):
    def __init__(self, cfg: ExpConfig):
        super().__init__()
        self.cfg = cfg
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.SiLU(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU())
        self.out = nn.Linear(cfg.hidden, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        pred = self.out(self.body(x)).squeeze(-1)
        return F.smooth_l1_loss(pred, y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=0.05)


class SyntheticData(pl.LightningDataModule):
    def __init__(self, cfg: ExpConfig):
        super().__init__()
        self.cfg = cfg

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.cfg.seed)
        x = torch.randn(self.cfg.n_samples, self.cfg.in_dim, generator=g)
        y = torch.sin(x[:, :4].sum(-1)) + 0.1 * torch.randn(self.cfg.n_samples, generator=g)
        self.ds = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.cfg.batch_size, shuffle=True)


def accumulation_callback(cfg: ExpConfig):
    # accumulate cfg.grad_accum batches from the first epoch on (epochs are 0-indexed)
    return GradientAccumulationScheduler(scheduling={0: cfg.grad_accum})


def main():
    cfg = ExpConfig()
    pl.seed_everything(cfg.seed, workers=True)
    model = Regressor(cfg)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=cfg.max_epochs, callbacks=[accumulation_callback(cfg)],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, datamodule=SyntheticData(cfg))
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"optimizer steps: {trainer.global_step}")
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
