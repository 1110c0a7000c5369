"""Lightning DDP classifier with linear LR decay and gradient accumulation.

Data lives in a LightningDataModule; the LR decays linearly to zero over the run.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--n-train", type=int, default=192)
    return p.parse_args()


class BlobsData(pl.LightningDataModule):
    def __init__(self, n_train, batch_size):
        super().__init__()
        self.n_train, self.batch_size = n_train, batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(7)
        centers = torch.randn(6, 20, generator=g) * 2.0
        y = torch.randint(0, 6, (self.n_train,), generator=g)
        x = centers[y] + torch.randn(self.n_train, 20, generator=g)
        self.train_set = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)


class Classifier(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 6))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def _total_optimizer_steps(self):
        # per-rank optimizer steps (the datamodule's own loader is not sharded yet)
        return int(self.trainer.estimated_stepping_batches)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        total = self._total_optimizer_steps()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    pl.seed_everything(0, workers=True)
    dm = BlobsData(args.n_train, args.batch_size)
    model = Classifier(args.lr)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate, deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {final_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
