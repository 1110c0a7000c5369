"""Lightning DDP, 2 CPU ranks, multi-task regression + classification with learned
task-uncertainty weights (Kendall et al., 2018), accumulate_grad_batches=2."""
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49006")


class UncertaintyWeighting(nn.Module):
    """L = sum_i exp(-s_i) * L_i + s_i, with s_i = log sigma_i^2 learned."""

    def __init__(self, n_tasks):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n_tasks))

    def forward(self, losses):
        losses = torch.stack(losses)
        return (torch.exp(-self.log_vars) * losses + self.log_vars).sum()


@dataclass
class ExperimentConfig:
    n_in: int = 16
    n_classes: int = 4
    hidden: int = 48
    lr: float = 3e-3
    loss_lr: float = 5e-2
    batch_size: int = 4
    accumulate: int = 2
    epochs: int = 2
    loss_fn: nn.Module = field(default_factory=lambda: UncertaintyWeighting(2))


class MultiTask(pl.LightningModule):
    def __init__(self, cfg: ExperimentConfig):
        super().__init__()
        self.cfg = cfg
        self.net = nn.Sequential(nn.Linear(cfg.n_in, cfg.hidden), nn.Tanh())
        self.cls_head = nn.Linear(cfg.hidden, cfg.n_classes)
        self.reg_head = nn.Linear(cfg.hidden, 1)
        self.loss_fn = cfg.loss_fn

    def training_step(self, batch, batch_idx):
        x, y_cls, y_reg = batch
        h = self.net(x)
        l_cls = F.cross_entropy(self.cls_head(h), y_cls)
        l_reg = F.mse_loss(self.reg_head(h).squeeze(-1), y_reg)
        return self.loss_fn([l_cls, l_reg])

    def configure_optimizers(self):
        return torch.optim.Adam([
            {"params": [p for n, p in self.named_parameters() if not n.startswith("loss_fn.")],
             "lr": self.cfg.lr},
            {"params": self.loss_fn.parameters(), "lr": self.cfg.loss_lr},
        ])


def make_loader(cfg):
    g = torch.Generator().manual_seed(42)
    x = torch.randn(192, cfg.n_in, generator=g)
    y_cls = (x[:, :4].argmax(dim=1)) % cfg.n_classes
    y_reg = 3.0 * x[:, 4] - x[:, 5] + 0.5 * torch.randn(192, generator=g)
    return DataLoader(TensorDataset(x, y_cls, y_reg), batch_size=cfg.batch_size, shuffle=False)


def main():
    pl.seed_everything(0, workers=True)
    cfg = ExperimentConfig()
    model = MultiTask(cfg)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.epochs,
                         accumulate_grad_batches=cfg.accumulate, deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, make_loader(cfg))
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        params = [p for m in (model.net, model.cls_head, model.reg_head, cfg.loss_fn)
                  for p in m.parameters()]          # = named_parameters() order, loss weights last
        for p in params:
            h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
