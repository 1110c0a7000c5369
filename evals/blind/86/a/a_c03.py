"""Lightning Trainer with accumulate_grad_batches, bf16-mixed, a norm clip, a frozen stem,
and a run split in two: the second half resumes from a checkpoint into a fresh module and Trainer.

Launch: torchrun --nproc-per-node 2 ... a_c03.py
"""
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

CKPT = "/tmp/a_c03_ckpt/epoch1.ckpt"


class Denoiser(pl.LightningModule):
    def __init__(self, dim=16, hidden=48, lr=3e-3, wd=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.stem = nn.Linear(dim, hidden)
        self.stem.requires_grad_(False)  # pretrained projection, kept frozen
        self.block = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.block(h))

    def training_step(self, batch, batch_idx):
        clean, noise = batch
        pred = self(clean + noise)
        return F.mse_loss(pred.float(), noise)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.wd)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader():
    g = torch.Generator().manual_seed(2)
    clean = torch.randn(160, 16, generator=g)
    noise = 2.0 * torch.randn(160, 16, generator=g)
    # 80 samples per rank, micro-batches of 10 -> 8 micro-batches -> 4 windows of 2 per epoch
    return DataLoader(TensorDataset(clean, noise), batch_size=10, shuffle=False)


def make_trainer(epochs):
    return pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
        max_epochs=epochs, accumulate_grad_batches=2,
        gradient_clip_val=0.5, gradient_clip_algorithm="norm",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )


def main():
    os.makedirs(os.path.dirname(CKPT), exist_ok=True)
    pl.seed_everything(17, workers=True)
    first = Denoiser()
    t1 = make_trainer(epochs=2)
    t1.fit(first, loader())
    t1.save_checkpoint(CKPT)
    t1.strategy.barrier()

    pl.seed_everything(99, workers=True)  # fresh module, weights come from the checkpoint
    second = Denoiser()
    t2 = make_trainer(epochs=4)
    t2.fit(second, loader(), ckpt_path=CKPT)

    if t2.is_global_zero:
        print(f"optimizer steps: {t2.global_step}")
        h = hashlib.sha256()
        for _, p in second.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
