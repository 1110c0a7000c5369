"""Tabular classifier trained with Lightning manual optimisation (we want the step logic in
our hands: SGD with Nesterov momentum, a step schedule, and gradient accumulation)."""
import argparse
import hashlib

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def build_data(n, d, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(n, classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class TabularClassifier(pl.LightningModule):
    def __init__(self, d_in=16, hidden=64, classes=5, lr=0.05, accumulate=4, gamma=0.7):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sched = self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss / self.hparams.accumulate)
        if (batch_idx + 1) % self.hparams.accumulate == 0:
            opt.step()
            opt.zero_grad()
            sched.step()
        self.log("train_loss", loss.detach(), prog_bar=False)

    def configure_optimizers(self):
        opt = torch.optim.SGD(
            [
                {"params": self.encoder.parameters(), "lr": self.hparams.lr},
                {"params": self.head.parameters(), "lr": 2 * self.hparams.lr},
            ],
            momentum=0.9,
            nesterov=True,
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=self.hparams.gamma)
        return [opt], [sched]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--accumulate", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    pl.seed_everything(args.seed, workers=True)
    ds = build_data(2 * 16 * args.batch_size, 16, 5, args.seed)   # 16 batches per rank per epoch
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)
    model = TabularClassifier(accumulate=args.accumulate)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
