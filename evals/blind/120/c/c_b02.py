"""Tiny causal LM with PyTorch Lightning on 2 CPU ranks (DDP), warm-up + cosine schedule.

Launched with torchrun; Lightning picks the ranks up from the environment.
"""
import argparse
import hashlib
import math
import os
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore")


class TokenStream(Dataset):
    def __init__(self, n_seq, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, vocab, (n_seq, seq_len + 1), generator=g)
        # a little structure so the LM has something to learn
        base[:, 1::2] = (base[:, 0:-1:2] * 3 + 1) % vocab
        self.data = base

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, i):
        s = self.data[i]
        return s[:-1], s[1:]


class TinyLM(pl.LightningModule):
    def __init__(self, vocab=64, d_model=64, n_head=4, seq_len=32, lr=2e-3, warmup=2, total_steps=100):
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        self.block = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = self.block(h, src_mask=self.mask[: idx.shape[1], : idx.shape[1]], is_causal=True)
        return self.head(self.ln(h))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=(0.9, 0.95), weight_decay=0.1)

        def lr_lambda(step):
            if step < hp.warmup:
                return (step + 1) / hp.warmup
            progress = min(1.0, (step - hp.warmup) / max(1, hp.total_steps - hp.warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--n_seq", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main():
    args = parse()
    pl.seed_everything(args.seed, workers=True)
    world = int(os.environ.get("WORLD_SIZE", 1))
    ds = TokenStream(args.n_seq, 32, 64, args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=False)
    steps_per_epoch = math.ceil(len(ds) / (args.batch_size * world))
    total_steps = steps_per_epoch * args.epochs
    model = TinyLM(lr=args.lr, total_steps=total_steps)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accumulate, deterministic=True,
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
        print(f"optimizer steps {trainer.global_step} lr {trainer.optimizers[0].param_groups[0]['lr']:.3e}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
