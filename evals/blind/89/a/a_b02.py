# Lightning DDP regression with a cosine LR per optimizer step and gradient accumulation
import argparse
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--n-samples", type=int, default=384)
    return p.parse_args()


class Regressor(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        # one scheduler tick per optimizer step; account for gradient accumulation in the horizon
        total = self.trainer.estimated_stepping_batches * self.trainer.accumulate_grad_batches
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def make_data(n):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def main():
    args = parse_args()
    pl.seed_everything(0, workers=True)
    model = Regressor(args.lr)
    loader = DataLoader(make_data(args.n_samples), batch_size=args.batch_size, shuffle=False)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accumulate, deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
