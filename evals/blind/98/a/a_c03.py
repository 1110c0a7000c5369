"""Lightning classifier, DDP on CPU, accumulation schedule {0: 2, 1: 3}, validation every
5 batches, clipping at 0.5, a frozen input projection; epoch 1 is trained, checkpointed,
and epoch 2 resumes from the checkpoint in a fresh module and Trainer.

Launch: torchrun --nproc-per-node 2 a_c03.py
"""
import hashlib
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader, TensorDataset

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
IN, HID, CLS, BS, NB = 12, 48, 5, 8, 12


class Classifier(pl.LightningModule):
    def __init__(self, lr=0.02):
        super().__init__()
        self.save_hyperparameters()
        self.proj = nn.Linear(IN, HID)
        self.proj.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh())
        self.cls = nn.Linear(HID, CLS)

    def forward(self, x):
        return self.cls(self.body(self.proj(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr,
                              momentum=0.9, nesterov=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loaders(world):
    g = torch.Generator().manual_seed(21)
    x = torch.randn(BS * NB * world, IN, generator=g)
    y = (x[:, :CLS] * 2 + 0.3 * torch.randn(x.shape[0], CLS, generator=g)).argmax(-1)
    vx = torch.randn(BS * 2 * world, IN, generator=g)
    vy = vx[:, :CLS].argmax(-1)
    return (DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=False),
            DataLoader(TensorDataset(vx, vy), batch_size=BS))


def make_trainer(world, epochs):
    return pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp", max_epochs=epochs, val_check_interval=5,
        num_sanity_val_steps=0, gradient_clip_val=0.5, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[GradientAccumulationScheduler(scheduling={0: 2, 1: 3})],
    )


def main():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ckpt = f"/tmp/a_c03_{os.environ.get('MASTER_PORT', '0')}.ckpt"
    pl.seed_everything(4, verbose=False)
    train_dl, val_dl = loaders(world)

    first = make_trainer(world, 1)
    first.fit(Classifier(), train_dl, val_dl)
    first.save_checkpoint(ckpt)
    first.strategy.barrier()

    pl.seed_everything(4, verbose=False)  # same seed: Lightning's DistributedSampler takes it from PL_GLOBAL_SEED
    model = Classifier()
    second = make_trainer(world, 2)
    second.fit(model, train_dl, val_dl, ckpt_path=ckpt)

    named = list(model.named_parameters())
    if second.is_global_zero:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, p in named:
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
        os.remove(ckpt)


if __name__ == "__main__":
    main()
