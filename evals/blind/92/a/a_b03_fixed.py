"""Lightning DDP: small transformer regressor with warm-up in optimizer_step."""
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

HPARAMS = dict(seed=11, accum=2, lr=2e-3, warmup=4, batch_size=4, n_samples=96, epochs=3, dim=32)


class SeqRegressor(pl.LightningModule):
    def __init__(self, seed, accum, lr, warmup, batch_size, n_samples, epochs, dim):
        super().__init__()
        self.save_hyperparameters()
        self.inp = nn.Linear(6, dim)
        self.enc = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, 1)
        self._opt_calls = 0

    def forward(self, x):
        return self.head(self.enc(self.inp(x)).mean(1)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self._opt_calls += 1
        scale = min(1.0, self._opt_calls / self.hparams.warmup)
        for g in optimizer.param_groups:
            g["lr"] = self.hparams.lr * scale
        optimizer.step(closure=optimizer_closure)


def make_data(hp):
    g = torch.Generator().manual_seed(hp["seed"])
    x = torch.randn(hp["n_samples"], 5, 6, generator=g)
    y = x[..., 0].mean(1) * 2.0 + x[..., 3].amax(1) + 0.1 * torch.randn(hp["n_samples"], generator=g)
    return TensorDataset(x, y)


def main():
    hp = HPARAMS
    pl.seed_everything(hp["seed"], workers=True)
    model = SeqRegressor(**hp)
    loader = DataLoader(make_data(hp), batch_size=hp["batch_size"], shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=hp["epochs"],
        accumulate_grad_batches=hp["accum"],
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
