"""Lightning DDP regression with an accumulation schedule (K 2, then 4 from epoch 2),
a frozen input projection, two AdamW parameter groups and norm clipping that acts."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler

BATCH, EPOCHS = 4, 4
N_SAMPLES = 64          # 8 micro-batches per rank per epoch: divisible by 2 and by 4


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)          # frozen random features
        self.body = nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.head = nn.Linear(32, 3)
        for p in self.proj.parameters():
            p.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        pred = self.head(self.body(torch.tanh(self.proj(x))))
        return F.smooth_l1_loss(pred, y)

    def configure_optimizers(self):
        groups = [
            {"params": list(self.body.parameters()), "lr": 3e-3, "weight_decay": 0.05},
            {"params": list(self.head.parameters()), "lr": 1e-2, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups)


def make_loader():
    g = torch.Generator().manual_seed(21)
    x = torch.randn(N_SAMPLES, 16, generator=g)
    w = torch.randn(16, 3, generator=g)
    y = torch.sin(x @ w) * 3.0 + 0.1 * torch.randn(N_SAMPLES, 3, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(0, workers=True)
    model = Regressor()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
        callbacks=[GradientAccumulationScheduler(scheduling={0: 2, 2: 4})],
        gradient_clip_val=0.12, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=make_loader())
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {final_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
