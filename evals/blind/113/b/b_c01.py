"""Bag-of-tokens classifier with Lightning (automatic optimisation), 2 DDP ranks.

K = 3 micro-batches per step, 9 batches per rank and epoch (no short window),
a frozen pretrained-style embedding table, gradient clipping at 0.25, OneCycleLR
stepped per optimizer step and a DataLoader worker. The first epoch runs in one
Trainer, which saves a checkpoint; a new module and a new Trainer resume from it.
"""
import hashlib
import os
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


@dataclass
class RunConfig:
    seed: int = 31
    vocab: int = 120
    seq_len: int = 12
    dim: int = 24
    classes: int = 4
    n_samples: int = 72
    batch_size: int = 4
    accumulate: int = 3
    epochs: int = 2
    max_lr: float = 5e-3
    clip: float = 0.25
    ckpt: str = "tmp_scratch/c01_epoch1.ckpt"


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    y = (x % cfg.classes).mode(dim=1).values
    return TensorDataset(x, y)


class BagClassifier(pl.LightningModule):
    def __init__(self, **cfg):
        super().__init__()
        self.save_hyperparameters()
        c = self.hparams
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.embed.weight.requires_grad_(False)
        self.mlp = nn.Sequential(nn.Linear(c.dim, 48), nn.GELU(), nn.Linear(48, c.classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.mlp(self.embed(x).mean(1)), y)

    def configure_optimizers(self):
        c = self.hparams
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=c.max_lr)
        total = c.epochs * (c.n_samples // 2 // c.batch_size // c.accumulate)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=c.max_lr, total_steps=total, pct_start=0.3)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_trainer(cfg, max_epochs):
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs,
                      accumulate_grad_batches=cfg.accumulate, gradient_clip_val=cfg.clip,
                      deterministic=True, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    hp = {k: v for k, v in asdict(cfg).items() if k != "ckpt"}
    pl.seed_everything(cfg.seed, workers=True)
    data = make_dataset(cfg)

    def loader():
        return DataLoader(data, batch_size=cfg.batch_size, shuffle=True, num_workers=1,
                          persistent_workers=False)

    first = make_trainer(cfg, max_epochs=1)
    first.fit(BagClassifier(**hp), loader())
    first.save_checkpoint(cfg.ckpt)
    first.strategy.barrier()

    pl.seed_everything(cfg.seed + 1, workers=True)  # fresh objects; weights come from the checkpoint
    model = BagClassifier(**hp)
    second = make_trainer(cfg, max_epochs=cfg.epochs)
    second.fit(model, loader(), ckpt_path=cfg.ckpt)

    if second.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
