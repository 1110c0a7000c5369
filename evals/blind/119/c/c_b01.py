"""Lightning manual optimisation: a small classifier trained with hand accumulation and a norm clip."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class HParams:
    accum: int = 2
    lr: float = 3e-3
    clip: float = 0.5
    batch_size: int = 4
    n_samples: int = 64
    epochs: int = 3


class Classifier(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hp.lr, weight_decay=0.01)

    def _window_done(self, batch_idx):
        return (batch_idx + 1) % self.hp.accum == 0

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y) / self.hp.accum
        last = self._window_done(batch_idx)
        if last:
            # keep the update bounded before the optimizer runs
            self.clip_gradients(opt, gradient_clip_val=self.hp.clip, gradient_clip_algorithm="norm")
        self.manual_backward(loss)
        if last:
            opt.step()
            opt.zero_grad()
        self.log("loss", loss.detach() * self.hp.accum, prog_bar=False)


def make_data(hp):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(hp.n_samples, 16, generator=g) * 3.0
    w = torch.randn(16, 5, generator=g)
    y = (x @ w + 0.5 * torch.randn(hp.n_samples, 5, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def main():
    hp = HParams()
    pl.seed_everything(0, workers=True)
    model = Classifier(hp)
    loader = DataLoader(make_data(hp), batch_size=hp.batch_size, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=hp.epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
        print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
