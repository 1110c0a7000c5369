"""Fabric regression trainer: an encoder + head model trained with gradient accumulation
on 2 CPU ranks. The micro-step loop is split over a small Trainer class."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class TrainConfig:
    seed: int = 1234
    in_dim: int = 16
    hidden: int = 32
    micro_batch: int = 8
    grad_accum: int = 4
    epochs: int = 2
    batches_per_epoch: int = 24      # per rank -> 6 windows per epoch
    lr: float = 3e-3
    weight_decay: float = 0.01


class Regressor(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
                                     nn.Linear(cfg.hidden, cfg.hidden), nn.GELU())
        self.head = nn.Linear(cfg.hidden, 1)

    def forward(self, x):
        return self.head(self.encoder(x)).squeeze(-1)


def make_dataset(cfg: TrainConfig, world_size: int):
    g = torch.Generator().manual_seed(cfg.seed)
    n = cfg.micro_batch * cfg.batches_per_epoch * world_size
    x = torch.randn(n, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, generator=g)
    return torch.utils.data.TensorDataset(x, y)


class Trainer:
    def __init__(self, fabric: Fabric, cfg: TrainConfig):
        self.fabric, self.cfg = fabric, cfg
        model = Regressor(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.model, self.optimizer = fabric.setup(model, opt)
        ds = make_dataset(cfg, fabric.world_size)
        loader = torch.utils.data.DataLoader(ds, batch_size=cfg.micro_batch, shuffle=False)
        self.loader = fabric.setup_dataloaders(loader, use_distributed_sampler=True)

    def micro_step(self, batch_idx, batch):
        x, y = batch
        # skip the all-reduce while accumulating (see Fabric.no_backward_sync docs)
        with self.fabric.no_backward_sync(self.model, enabled=(batch_idx % self.cfg.grad_accum != 0)):
            pred = self.model(x)
            loss = F.mse_loss(pred, y) / self.cfg.grad_accum
            self.fabric.backward(loss)
        return loss.detach()

    def optimizer_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.loader.sampler.set_epoch(epoch)
            for batch_idx, batch in enumerate(self.loader):
                self.micro_step(batch_idx, batch)
                if (batch_idx + 1) % self.cfg.grad_accum == 0:
                    self.optimizer_step()


def main():
    cfg = TrainConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="32-true")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(fabric, cfg)
    trainer.fit()
    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
