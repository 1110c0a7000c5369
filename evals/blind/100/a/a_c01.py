"""Sequence tagger trained with PyTorch Lightning (automatic optimisation, DDP on CPU).

Gradient accumulation through the Trainer; a OneCycle schedule over the optimizer steps,
with a gradient-norm clip.
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
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Tagger(pl.LightningModule):
    def __init__(self, vocab=64, dim=32, n_tags=6, max_lr=3e-3, accumulate=1):
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, n_tags)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.max_lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.hparams.max_lr,
            total_steps=int(self.trainer.estimated_stepping_batches) + 1,
            pct_start=0.3,
        )
        # one LR move per accumulated window of batches
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": "step",
                                 "frequency": self.hparams.accumulate}}


def make_data(seed, n=256, seq=12, vocab=64, n_tags=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, seq), generator=g)
    y = (x * 7 + torch.roll(x, 1, dims=1)) % n_tags
    return TensorDataset(x, y)


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    model = Tagger(max_lr=args.max_lr, accumulate=args.accumulate)
    loader = DataLoader(make_data(args.seed), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    # 256 samples / 2 ranks / 8 = 16 micro-batches per epoch -> 4 optimizer steps per epoch
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate, gradient_clip_val=0.05, gradient_clip_algorithm="norm",
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
