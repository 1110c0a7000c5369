"""Lightning automatic optimisation: K = 3 via `accumulate_grad_batches`, a frozen input
projection, two AdamW groups, norm clipping by the Trainer, and a linear warm-up done by
hand in an `optimizer_step` override keyed on `trainer.global_step` (optimizer steps)."""
import hashlib
from dataclasses import dataclass

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class HParams:
    d_in: int = 20
    width: int = 48
    n_out: int = 3
    lr: float = 2e-3
    warmup: int = 4
    accumulate: int = 3
    batch_size: int = 4
    batches_per_rank: int = 9     # 3 full windows per epoch
    epochs: int = 3
    clip: float = 0.3
    seed: int = 2024


class Regressor(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.proj = nn.Linear(hp.d_in, hp.width)
        self.proj.requires_grad_(False)              # frozen random projection
        self.body = nn.Sequential(nn.SiLU(), nn.Linear(hp.width, hp.width), nn.SiLU())
        self.out = nn.Linear(hp.width, hp.n_out)

    def forward(self, x):
        return self.out(self.body(self.proj(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.smooth_l1_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(
            [
                {"params": self.body.parameters(), "weight_decay": 0.05},
                {"params": self.out.parameters(), "weight_decay": 0.0},
            ],
            lr=self.hp.lr,
        )

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        scale = min(1.0, (self.trainer.global_step + 1) / self.hp.warmup)
        for group in optimizer.param_groups:
            group["lr"] = scale * self.hp.lr
        optimizer.step(closure=optimizer_closure)


def main():
    hp = HParams()
    pl.seed_everything(hp.seed, workers=True)
    g = torch.Generator().manual_seed(hp.seed)
    n = 2 * hp.batches_per_rank * hp.batch_size
    x = torch.randn(n, hp.d_in, generator=g)
    y = torch.stack([x[:, :5].sum(1), x[:, 5:9].prod(1), torch.sin(x[:, 9])], dim=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=hp.batch_size, shuffle=True)
    model = Regressor(hp)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=hp.epochs,
        accumulate_grad_batches=hp.accumulate, gradient_clip_val=hp.clip, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
