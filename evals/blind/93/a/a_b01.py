"""Fabric DDP trainer for a small intent scorer, gradient accumulation via no_backward_sync."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning_fabric import Fabric


@dataclass
class Cfg:
    in_dim: int = 24
    hidden: int = 48
    n_cls: int = 6
    micro_bs: int = 8
    grad_accum: int = 4
    epochs: int = 2
    n_samples: int = 512  # 256 per rank -> 32 micro-batches -> 8 updates / epoch
    lr: float = 3e-3
    seed: int = 1234


class IntentScorer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.GELU())
        self.cls = nn.Linear(cfg.hidden, cfg.n_cls)

    def forward(self, x):
        return self.cls(self.body(x))



def compute_loss(net, batch):
    x, y = batch
    return F.cross_entropy(net(x), y, label_smoothing=0.05)


def make_data(cfg):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.n_cls, generator=g)
    y = (x @ w + 0.5 * torch.randn(cfg.n_samples, cfg.n_cls, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def main():
    cfg = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    scorer = IntentScorer(cfg)
    opt = torch.optim.AdamW(scorer.parameters(), lr=cfg.lr, weight_decay=0.01)
    model, opt = fabric.setup(scorer, opt)
    loader = fabric.setup_dataloaders(DataLoader(make_data(cfg), batch_size=cfg.micro_bs, shuffle=False))

    K = cfg.grad_accum
    for epoch in range(cfg.epochs):
        for i, batch in enumerate(loader):
            is_accumulating = (i + 1) % K != 0
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                loss = compute_loss(scorer, batch)
                fabric.backward(loss / K)
            if not is_accumulating:
                opt.step()
                opt.zero_grad()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in scorer.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
