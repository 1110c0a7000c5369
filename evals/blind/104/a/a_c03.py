"""Sequence regression with PyTorch Lightning DDP on 2 CPU ranks, preempted and resumed.

accumulate_grad_batches=2, Lightning's own norm clip (which acts), a frozen
input projection, OneCycleLR stepped per optimizer step over
`estimated_stepping_batches`.  The first Trainer stops after epoch 1 and saves a
checkpoint; a fresh model and Trainer resume from it and finish the run.
"""
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "a_c03_preempt.ckpt")


class Config:
    d_in = 6
    d_model = 24
    seq = 12
    n = 160            # 2 ranks x 10 micro-batches x 8
    batch = 8
    accum = 2
    epochs = 3
    max_lr = 1e-2
    clip = 0.2
    seed = 5


def build_dataset(c):
    g = torch.Generator().manual_seed(c.seed)
    x = torch.randn(c.n, c.seq, c.d_in, generator=g)
    y = x[:, :, 0].cumsum(1)[:, -1:] * 0.3 + x[:, -1, 1:2]
    return TensorDataset(x, y)


class GRURegressor(pl.LightningModule):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.proj = nn.Linear(c.d_in, c.d_model)
        self.proj.requires_grad_(False)       # fixed random projection
        self.rnn = nn.GRU(c.d_model, c.d_model, batch_first=True)
        self.out = nn.Linear(c.d_model, 1)

    def forward(self, x):
        h, _ = self.rnn(torch.tanh(self.proj(x)))
        return self.out(h[:, -1])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad],
                                lr=self.c.max_lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.c.max_lr, total_steps=int(self.trainer.estimated_stepping_batches),
            pct_start=0.2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(build_dataset(self.c), batch_size=self.c.batch, shuffle=True)


class StopAfterEpoch(Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def make_trainer(c, callbacks=()):
    return pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=c.epochs,
        accumulate_grad_batches=c.accum, gradient_clip_val=c.clip, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=list(callbacks),
        default_root_dir=os.path.join(HERE, "tmp_scratch", "a_c03"),
    )


def main():
    c = Config()
    pl.seed_everything(c.seed, workers=True)
    model = GRURegressor(c)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}

    first = make_trainer(c, [StopAfterEpoch(0)])
    first.fit(model)
    first.save_checkpoint(CKPT)

    # "new job": fresh objects, weights come from the checkpoint
    pl.seed_everything(c.seed, workers=True)
    model2 = GRURegressor(c)
    model2.load_state_dict(init_state)     # overwritten by the checkpoint anyway
    second = make_trainer(c)
    second.fit(model2, ckpt_path=CKPT)
    assert second.global_step == c.epochs * (c.n // (2 * c.batch)) // c.accum, second.global_step

    if second.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model2.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
