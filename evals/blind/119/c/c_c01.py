"""Lightning automatic optimisation: accumulate_grad_batches=3, a frozen input projection,
a norm clip that acts and a per-step StepLR."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 3
EPOCHS = 2
BATCH = 4
N = 72  # 9 batches per rank per epoch: three full windows


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 24)
        self.proj.requires_grad_(False)
        self.head = nn.Sequential(nn.GELU(), nn.Linear(24, 24), nn.GELU(), nn.Linear(24, 1))

    def forward(self, x):
        return self.head(self.proj(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=5e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    pl.seed_everything(3, workers=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, 12, generator=g)
    y = 4.0 * torch.sin(x[:, 0]) + x[:, 1:4].sum(-1) ** 2
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    model = Regressor()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUM, gradient_clip_val=0.25, gradient_clip_algorithm="norm",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
        print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
