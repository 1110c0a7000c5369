"""beta-VAE on tabular sensor windows, DDP over 2 ranks, gradient accumulation.

Launch with torchrun (see c_b01.cmd).
"""
import contextlib
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class VAEConfig:
    in_dim: int = 24
    hidden: int = 64
    latent: int = 8
    beta: float = 0.5
    lr: float = 3e-3
    micro_batch: int = 8
    grad_accum: int = 4
    max_steps: int = 12
    seed: int = 1234


class VAE(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.SiLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU())
        self.mu = nn.Linear(cfg.hidden, cfg.latent)
        self.logvar = nn.Linear(cfg.hidden, cfg.latent)
        self.dec = nn.Sequential(nn.Linear(cfg.latent, cfg.hidden), nn.SiLU(), nn.Linear(cfg.hidden, cfg.in_dim))

    def forward(self, x, eps):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + eps * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def sync_context(model: DDP, sync: bool):
    """Return the context a micro-step should run under.

    sync=True  -> gradients are all-reduced on this backward
    sync=False -> gradients stay local (accumulating)
    """
    return contextlib.nullcontext() if sync else model.no_sync()


class VAETrainer:
    def __init__(self, cfg: VAEConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = VAE(cfg)
        self.ddp = DDP(self.model)
        self.opt = torch.optim.Adam(self.ddp.parameters(), lr=cfg.lr)
        g = torch.Generator().manual_seed(cfg.seed + 17)
        n = cfg.micro_batch * cfg.grad_accum * self.world * cfg.max_steps
        basis = torch.randn(4, cfg.in_dim, generator=g)
        self.data = torch.randn(n, 4, generator=g) @ basis + 0.1 * torch.randn(n, cfg.in_dim, generator=g)
        self.noise = torch.randn(n, cfg.latent, generator=g)

    def micro_batch(self, step, micro):
        c = self.cfg
        idx = ((step * c.grad_accum + micro) * self.world + self.rank) * c.micro_batch
        return self.data[idx: idx + c.micro_batch], self.noise[idx: idx + c.micro_batch]

    def loss_fn(self, x, eps):
        recon, mu, logvar = self.ddp(x, eps)
        rec = F.mse_loss(recon, x, reduction="none").sum(-1).mean()
        kl = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1)).mean()
        return rec + self.cfg.beta * kl

    def train_step(self, step):
        K = self.cfg.grad_accum
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for micro in range(K):
            x, eps = self.micro_batch(step, micro)
            last = micro == K - 1
            with sync_context(self.ddp, sync=last):
                loss = self.loss_fn(x, eps) / K
                loss.backward()
            total += loss.item()
        self.opt.step()
        return total

    def fit(self):
        for step in range(self.cfg.max_steps):
            l = self.train_step(step)
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {l:.4f}", flush=True)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = VAETrainer(VAEConfig())
    trainer.fit()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
