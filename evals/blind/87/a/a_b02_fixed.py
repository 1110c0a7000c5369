"""Lightning Trainer, DDP on 2 CPU ranks, accumulate_grad_batches=4, linear LR decay per step."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


def build_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.2)
    return p.parse_args()


class TinyClassifier(pl.LightningModule):
    def __init__(self, lr, n_classes=5, d_in=12, d_h=24):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(d_in, d_h), nn.ReLU(), nn.Linear(d_h, d_h), nn.ReLU())
        self.head = nn.Linear(d_h, n_classes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.head(self.encoder(x)), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    args = build_args()
    pl.seed_everything(args.seed, workers=True)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 12, generator=g)
    y = torch.randint(0, 5, (args.samples,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)
    model = TinyClassifier(args.lr)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accumulate, deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
