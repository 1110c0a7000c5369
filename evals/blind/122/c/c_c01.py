"""Logit distillation in Lightning: frozen teacher living inside the LightningModule,
bf16-mixed autocast, K = 3 over 9-batch epochs per rank, a clip that acts, a
per-step cosine schedule over estimated_stepping_batches and a worker DataLoader."""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


class SyntheticDigits(Dataset):
    def __init__(self, n=72, dim=20, seed=11):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 6, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class KDModule(pl.LightningModule):
    def __init__(self, temperature=2.0, alpha=0.7, lr=5e-3):
        super().__init__()
        self.save_hyperparameters()
        self.teacher = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 6))
        for p in self.teacher.parameters():
            p.requires_grad = False
        self.student = nn.Sequential(nn.Linear(20, 24), nn.ReLU(), nn.Linear(24, 6))

    def on_train_epoch_start(self):
        self.teacher.eval()

    def training_step(self, batch, batch_idx):
        x, y = batch
        T = self.hparams.temperature
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        kd = F.kl_div(F.log_softmax(s_logits.float() / T, -1), F.softmax(t_logits.float() / T, -1),
                      reduction="batchmean") * T * T
        ce = F.cross_entropy(s_logits.float(), y)
        return self.hparams.alpha * kd + (1 - self.hparams.alpha) * ce

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.student.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    pl.seed_everything(42, workers=True)
    dm = DataLoader(SyntheticDigits(), batch_size=4, shuffle=True, num_workers=1)
    model = KDModule()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=2, accumulate_grad_batches=3, gradient_clip_val=0.05,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
