"""Tiny token classifier (embedding + GRU + head) trained with Lightning DDP.

The LR schedule (linear warm-up then cosine) lives in a reusable callback so the same
module can be trained with different schedules; two parameter groups (encoder / head)
each keep their own base LR.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    vocab: int = 50
    d_model: int = 32
    n_classes: int = 5
    seq_len: int = 12
    n_samples: int = 432
    batch_size: int = 6
    accumulate: int = 3
    epochs: int = 2
    enc_lr: float = 2e-3
    head_lr: float = 1e-2
    weight_decay: float = 0.01
    warmup_frac: float = 0.25
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    seed: int = 11


class WarmupCosine(Callback):
    """Sets every param group's LR right before the optimizer steps."""

    def __init__(self, warmup_frac: float, min_lr_ratio: float):
        self.warmup_frac = warmup_frac
        self.min_lr_ratio = min_lr_ratio
        self.total = None
        self.base = None

    def on_train_start(self, trainer, pl_module):
        self.total = int(trainer.estimated_stepping_batches)
        self.base = [g["lr"] for g in trainer.optimizers[0].param_groups]

    def factor(self, step: int) -> float:
        warm = max(1, int(self.warmup_frac * self.total))
        if step < warm:
            return (step + 1) / warm
        prog = min(1.0, (step - warm) / max(1, self.total - warm))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        step = trainer.global_step
        f = self.factor(step)
        for g, base in zip(optimizer.param_groups, self.base):
            g["lr"] = base * f


class GRUTagger(pl.LightningModule):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.rnn = nn.GRU(cfg.d_model, cfg.d_model, batch_first=True)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h[:, -1])

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        return F.cross_entropy(self(tokens), labels)

    def configure_optimizers(self):
        enc = list(self.emb.parameters()) + list(self.rnn.parameters())
        return torch.optim.AdamW(
            [{"params": enc, "lr": self.cfg.enc_lr},
             {"params": self.head.parameters(), "lr": self.cfg.head_lr}],
            weight_decay=self.cfg.weight_decay,
        )


def synthetic(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    labels = (tokens[:, :4].sum(-1) + tokens[:, -1]) % cfg.n_classes
    return TensorDataset(tokens, labels)


def sha256_of(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(cfg: Config):
    pl.seed_everything(cfg.seed, workers=True)
    model = GRUTagger(cfg)
    loader = DataLoader(synthetic(cfg), batch_size=cfg.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.epochs,
        accumulate_grad_batches=cfg.accumulate,
        gradient_clip_val=cfg.clip, gradient_clip_algorithm="norm",
        callbacks=[WarmupCosine(cfg.warmup_frac, cfg.min_lr_ratio)],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        import sys
        if len(sys.argv) > 2 and sys.argv[1] == "--dump":
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, sys.argv[2])
        print(f"FINAL_SHA256 {sha256_of(model)}", flush=True)


if __name__ == "__main__":
    main(Config())
