"""DDPM-style denoiser on 2 DDP ranks (torchrun): bf16 autocast forward, a frozen
sinusoidal time-embedding table, an EMA copy for sampling, clipping at 0.3 after
the window's sync. Config lives in a dataclass; the loop is split over methods.
"""
import os
import math
import copy
import hashlib
from dataclasses import dataclass
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Cfg:
    accum: int = 2
    micro_bs: int = 16
    updates: int = 20
    lr: float = 1e-3
    clip: float = 0.3
    ema: float = 0.99
    n_t: int = 100


class Denoiser(nn.Module):
    def __init__(self, n_t, dim=8, hid=64):
        super().__init__()
        half = 8
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)
        ang = torch.arange(n_t)[:, None] * freqs[None]
        self.t_table = nn.Parameter(torch.cat([ang.sin(), ang.cos()], -1), requires_grad=False)
        self.net = nn.Sequential(nn.Linear(dim + 2 * half, hid), nn.SiLU(), nn.Linear(hid, hid), nn.SiLU(),
                                 nn.Linear(hid, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, self.t_table[t]], -1))


class DiffusionTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        self.raw = Denoiser(cfg.n_t)
        self.model = DDP(self.raw, gradient_as_bucket_view=True)
        self.ema = copy.deepcopy(self.raw).requires_grad_(False)
        self.opt = torch.optim.Adam([p for p in self.raw.parameters() if p.requires_grad], lr=cfg.lr)
        betas = torch.linspace(1e-4, 0.05, cfg.n_t)
        self.abar = torch.cumprod(1 - betas, 0)
        self.g = torch.Generator().manual_seed(77 + self.rank)
        self.micro = 0

    def sample_batch(self):
        x0 = torch.randn(self.cfg.micro_bs, 8, generator=self.g) * 0.3 + torch.arange(8) / 8
        t = torch.randint(0, self.cfg.n_t, (self.cfg.micro_bs,), generator=self.g)
        noise = torch.randn(x0.shape, generator=self.g)
        a = self.abar[t][:, None]
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, noise

    def micro_step(self):
        xt, t, noise = self.sample_batch()
        self.micro += 1
        boundary = self.micro % self.cfg.accum == 0
        self.model.require_backward_grad_sync = boundary
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = self.model(xt, t)
        loss = F.mse_loss(pred.float(), noise) / self.cfg.accum
        loss.backward()
        return boundary, loss.item()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.raw.parameters(), self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.raw.parameters()):
                e.lerp_(p, 1 - self.cfg.ema)

    def fit(self):
        updates = 0
        while updates < self.cfg.updates:
            boundary, loss = self.micro_step()
            if boundary:
                self.optimizer_step()
                updates += 1
                if self.rank == 0 and updates % 5 == 0:
                    print(f"update {updates} loss {loss * self.cfg.accum:.4f}", flush=True)


def main():
    dist.init_process_group("gloo")
    tr = DiffusionTrainer(Cfg())
    tr.fit()
    h = hashlib.sha256()
    for _, p in tr.raw.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if tr.rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
