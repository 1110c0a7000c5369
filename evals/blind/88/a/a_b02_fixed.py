"""Regression with PyTorch Lightning on 2 DDP ranks (launched by torchrun) and gradient accumulation.

Linear learning-rate warm-up over the first `warmup` optimizer updates, done by hand in
`optimizer_step` (the pattern from the Lightning docs), then constant.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    seed: int = 7
    n_samples: int = 384
    batch_size: int = 4
    accumulate: int = 4
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    warmup: int = 16  # optimizer updates


class Regressor(pl.LightningModule):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.cfg = cfg
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        # warm up the learning rate by hand, no scheduler object
        step = self.trainer.global_step  # optimizer updates done so far
        scale = min(1.0, (step + 1) / self.cfg.warmup)
        for group in optimizer.param_groups:
            group["lr"] = scale * self.cfg.lr
        optimizer.step(closure=optimizer_closure)


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, 16, generator=g)
    w = torch.randn(16, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(cfg.n_samples, generator=g)
    return TensorDataset(x, y)


def main():
    cfg = Cfg()
    pl.seed_everything(cfg.seed, workers=True)
    model = Regressor(cfg)
    loader = DataLoader(make_data(cfg), batch_size=cfg.batch_size, shuffle=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
                         max_epochs=cfg.epochs, accumulate_grad_batches=cfg.accumulate,
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("DUMP_DIR"):
            torch.save(flat, os.path.join(os.environ["DUMP_DIR"], os.path.basename(__file__) + ".pt"))


if __name__ == "__main__":
    main()
