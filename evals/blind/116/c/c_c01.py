"""Review-sentiment classifier over token ids, PyTorch Lightning automatic
optimisation on 2 DDP ranks: a frozen pretrained-style embedding table, bf16
autocast, two AdamW parameter groups, a cosine schedule per optimizer step,
gradient-norm clipping and accumulation over 3 batches.

Launch: torchrun --nproc-per-node 2 c_c01.py
"""
import argparse
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ, N_CLASSES = 64, 12, 3


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    polarity = torch.linspace(-1, 1, VOCAB)
    score = polarity[ids].mean(-1) + 0.1 * torch.randn(n, generator=g)
    labels = torch.bucketize(score, torch.tensor([-0.08, 0.08]))
    return TensorDataset(ids, labels)


class SentimentModel(pl.LightningModule):
    def __init__(self, dim=32, lr=3e-3, weight_decay=0.05, warmup_steps=2):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, dim)
        self.embed.weight.requires_grad_(False)        # frozen, "pretrained"
        self.mixer = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.classifier = nn.Linear(dim, N_CLASSES)

    def forward(self, ids):
        h = self.mixer(self.embed(ids)).mean(1)
        return self.classifier(h)

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        logits = self(ids)
        return F.cross_entropy(logits.float(), labels)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for n, p in self.named_parameters() if p.requires_grad and p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
        )
        total = int(self.trainer.estimated_stepping_batches)
        warm = self.hparams.warmup_steps

        def lr_lambda(step):
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return [opt], [{"scheduler": sched, "interval": "step", "frequency": 1}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--clip", type=float, default=0.05)
    args = ap.parse_args()

    pl.seed_everything(11, workers=True)
    ds = make_dataset(96, seed=5)          # 48 per rank -> 12 batches -> 4 windows of 3 per epoch
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True, num_workers=1)
    model = SentimentModel()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp",
        precision="bf16-mixed",
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accum,
        gradient_clip_val=args.clip, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
