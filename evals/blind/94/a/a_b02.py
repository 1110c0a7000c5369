"""Tabular regressor with PyTorch Lightning, DDP on 2 CPU ranks, accumulate_grad_batches=3.

A small callback keeps memory down by releasing gradients before each batch.
"""
import argparse
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class GradMemoryCallback(pl.Callback):
    """Drop stale .grad tensors so the next forward has more headroom."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.zero_grad(set_to_none=True)


class Regressor(pl.LightningModule):
    def __init__(self, d_in=16, hidden=32, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Linear(d_in, hidden)
        self.block = nn.Sequential(nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(self.block(self.embed(x))).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.smooth_l1_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


def main():
    args = parse()
    pl.seed_everything(args.seed, workers=True)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(144, 16, generator=g)
    y = torch.sin(x[:, :4].sum(-1)) + 0.1 * torch.randn(144, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = Regressor()
    callbacks = [GradMemoryCallback()]
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accumulate, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        torch.save({n: p.detach().float().clone() for n, p in model.named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__) + ".params.pt"))


if __name__ == "__main__":
    main()
