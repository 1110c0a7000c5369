"""Linear probe, then full fine-tune: PyTorch Lightning, automatic optimisation, DDP on CPU.

Epoch 0 trains the head only (encoder frozen); from epoch 1 the encoder trains too.
Gradient accumulation through the Trainer.
"""
import argparse
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--unfreeze-epoch", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class ProbeThenTune(pl.LightningModule):
    def __init__(self, vocab=64, dim=32, n_cls=5, lr=2e-3, unfreeze_epoch=1):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Embedding(vocab, dim), nn.Flatten(1), nn.Linear(dim * 10, dim), nn.GELU())
        self.head = nn.Linear(dim, n_cls)

    def setup(self, stage):
        # linear probe first
        self.encoder.requires_grad_(False)

    def on_train_epoch_start(self):
        if self.current_epoch == self.hparams.unfreeze_epoch:
            self.encoder.requires_grad_(True)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        # every parameter is in the optimizer; frozen ones simply have no grad yet
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.0)


def make_data(seed, n=288, seq=10, vocab=64, n_cls=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, seq), generator=g)
    y = (x[:, 0] + 2 * x[:, -1]) % n_cls
    return TensorDataset(x, y)


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    model = ProbeThenTune(lr=args.lr, unfreeze_epoch=args.unfreeze_epoch)
    loader = DataLoader(make_data(args.seed), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    # 288 samples / 2 ranks / 8 = 18 micro-batches per epoch -> 6 optimizer steps per epoch
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
