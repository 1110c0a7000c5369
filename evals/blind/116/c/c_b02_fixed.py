"""Intent classifier over bag-of-token features, PyTorch Lightning (automatic
optimisation) on 2 DDP ranks, gradient accumulation through the Trainer.

Launch: torchrun --nproc-per-node 2 c_b02.py
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class HParams:
    n_samples: int = 96
    n_features: int = 24
    n_classes: int = 5
    hidden: int = 48
    batch_size: int = 4
    accumulate_grad_batches: int = 3
    max_epochs: int = 3
    lr: float = 1e-2
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    seed: int = 7


def linear_warmup_decay(num_warmup_steps, num_training_steps):
    def fn(step):
        if step < num_warmup_steps:
            return float(step + 1) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))
    return fn


class IntentData(pl.LightningDataModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.hp.seed)
        x = torch.randn(self.hp.n_samples, self.hp.n_features, generator=g)
        w = torch.randn(self.hp.n_features, self.hp.n_classes, generator=g)
        y = (x @ w + 0.5 * torch.randn(self.hp.n_samples, self.hp.n_classes, generator=g)).argmax(-1)
        self.train_set = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hp.batch_size, shuffle=True, drop_last=True)


class IntentClassifier(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.encoder = nn.Sequential(nn.Linear(hp.n_features, hp.hidden), nn.Tanh(), nn.Linear(hp.hidden, hp.hidden), nn.Tanh())
        self.head = nn.Linear(hp.hidden, hp.n_classes)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hp.lr, weight_decay=self.hp.weight_decay)
        num_training_steps = self.trainer.estimated_stepping_batches
        num_warmup_steps = int(self.hp.warmup_ratio * num_training_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay(num_warmup_steps, num_training_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    hp = HParams()
    pl.seed_everything(hp.seed, workers=True)
    model = IntentClassifier(hp)
    dm = IntentData(hp)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=hp.max_epochs,
        accumulate_grad_batches=hp.accumulate_grad_batches,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
