"""Lightning Fabric DDP (2 processes): denoising autoencoder on synthetic sensor windows.

Accumulation over K=4 micro-batches with 10 micro-batches per epoch and rank, so each
epoch ends in a short window of 2 that is normalised by its own length. The input
LayerNorm is frozen, SGD with Nesterov momentum, a StepLR stepped once per update and a
single clip per update.
"""
import hashlib
import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

cfg = SimpleNamespace(channels=8, window=24, hidden=40, batch=6, accum=4, batches_per_rank=10,
                      epochs=2, lr=0.05, gamma=0.7, clip=1.0, noise=0.3, seed=21)


class DAE(nn.Module):
    def __init__(self, c, t, h):
        super().__init__()
        self.norm = nn.LayerNorm(c * t)
        self.enc = nn.Sequential(nn.Linear(c * t, h), nn.SiLU(), nn.Linear(h, h // 2))
        self.dec = nn.Sequential(nn.Linear(h // 2, h), nn.SiLU(), nn.Linear(h, c * t))

    def forward(self, x):
        z = self.enc(self.norm(x.flatten(1)))
        return self.dec(z).view_as(x)


def windows_of(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    model = DAE(cfg.channels, cfg.window, cfg.hidden)
    for p in model.norm.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                          momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=cfg.gamma)
    model, opt = fabric.setup(model, opt)

    g = torch.Generator().manual_seed(cfg.seed)
    n = fabric.world_size * cfg.batches_per_rank * cfg.batch
    t = torch.linspace(0, 4 * math.pi, cfg.window)
    freq = torch.rand(n, cfg.channels, 1, generator=g) * 2 + 0.5
    clean = torch.sin(freq * t)
    loader = fabric.setup_dataloaders(
        DataLoader(TensorDataset(clean), batch_size=cfg.batch, shuffle=False))

    updates = 0
    for epoch in range(cfg.epochs):
        for win in windows_of(loader, cfg.accum):
            n_micro = len(win)  # 4, 4, then the epoch's short window of 2
            for j, (x,) in enumerate(win):
                noisy = x + cfg.noise * torch.randn(x.shape, generator=g)
                last = j == n_micro - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    loss = F.mse_loss(model(noisy), x) / n_micro
                    fabric.backward(loss)
            fabric.clip_gradients(model, opt, max_norm=cfg.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            updates += 1

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
    if fabric.global_rank == 0:
        print(f"updates {updates}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
