"""Sequence regressor (tiny transformer) trained with Lightning, DDP on CPU, K=3.

Launch: torchrun --nproc-per-node 2 a_b03.py
"""
import hashlib
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)

HPARAMS = dict(d_model=32, n_heads=4, n_layers=2, seq_len=10, in_dim=6, lr=3e-3, weight_decay=0.05,
               batch_size=8, accumulate=3, batches_per_rank=24, val_every=4, seed=7)


def make_split(n, seed, hp):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hp["seq_len"], hp["in_dim"], generator=g)
    w = torch.randn(hp["in_dim"], generator=g)
    y = torch.tanh(x @ w).mean(dim=1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class SeqRegressor(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters()
        self.inp = nn.Linear(hp["in_dim"], hp["d_model"])
        layer = nn.TransformerEncoderLayer(hp["d_model"], hp["n_heads"], 2 * hp["d_model"], dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, hp["n_layers"], enable_nested_tensor=False)
        self.out = nn.Linear(hp["d_model"], 1)

    def forward(self, x):
        return self.out(self.encoder(self.inp(x)).mean(dim=1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_mse", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ReleaseGradsBeforeEval(Callback):
    """Validation with large eval batches ran out of memory; drop the .grad buffers first."""

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        if (trainer.fit_loop.epoch_loop.batch_idx + 1) % trainer.accumulate_grad_batches != 0:
            return  # mid-window: the accumulated gradient is still needed
        pl_module.zero_grad(set_to_none=True)


class FinalHash(Callback):
    def on_train_end(self, trainer, pl_module):
        named = list(pl_module.named_parameters())
        if os.environ.get("PARAM_DUMP") and trainer.is_global_zero:
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, p in named:
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        if trainer.is_global_zero:
            print(f"FINAL_SHA256 {h.hexdigest()}")


def main(hp=HPARAMS):
    pl.seed_everything(hp["seed"], workers=True, verbose=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    train = make_split(hp["batch_size"] * hp["batches_per_rank"] * world, 11, hp)
    val = make_split(hp["batch_size"] * 2 * world, 12, hp)
    model = SeqRegressor(**hp)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp", max_epochs=1,
        accumulate_grad_batches=hp["accumulate"], val_check_interval=hp["val_every"],
        num_sanity_val_steps=0, deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ReleaseGradsBeforeEval(), FinalHash()],
    )
    trainer.fit(model, DataLoader(train, batch_size=hp["batch_size"], shuffle=False),
                DataLoader(val, batch_size=hp["batch_size"]))


if __name__ == "__main__":
    main()
