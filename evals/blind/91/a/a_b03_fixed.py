"""Tabular regressor with PyTorch Lightning on 2 DDP ranks.

Memory-lean settings: bf16 precision, accumulation of 4 micro-batches per update,
cosine decay stepped per optimizer step.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class HParams:
    seed: int = 11
    n_samples: int = 128
    in_dim: int = 20
    hidden: int = 64
    batch_size: int = 4
    accumulate: int = 4
    epochs: int = 3
    lr: float = 2e-3
    precision: str = "bf16-mixed"


class TabularRegressor(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.net = nn.Sequential(
            nn.Linear(hp.in_dim, hp.hidden), nn.SiLU(),
            nn.Linear(hp.hidden, hp.hidden), nn.SiLU(),
            nn.Linear(hp.hidden, 1),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        pred = self.net(x).squeeze(-1)
        return nn.functional.mse_loss(pred.float(), y.float())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hp.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_loader(hp: HParams):
    g = torch.Generator().manual_seed(hp.seed)
    x = torch.randn(hp.n_samples, hp.in_dim, generator=g)
    w = torch.randn(hp.in_dim, generator=g) / hp.in_dim ** 0.5
    y = torch.tanh(x @ w) * 3.0 + 0.05 * torch.randn(hp.n_samples, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=hp.batch_size, shuffle=False)


def main():
    hp = HParams()
    pl.seed_everything(hp.seed, workers=True)
    model = TabularRegressor(hp)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        precision=hp.precision,
        accumulate_grad_batches=hp.accumulate,
        max_epochs=hp.epochs,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, make_loader(hp))
    assert trainer.world_size == 2
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
