"""DDPM-style denoiser on a 2-D toy distribution with an EMA copy.

Ranks are spawned here. Gradients of each micro-batch are taken with
torch.autograd.grad and folded into accumulation buffers; the buffers are
all-reduced once per window and handed to the optimizer.
"""
import copy
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TrainConfig:
    world_size: int = 2
    port: int = 47203
    micro_batch: int = 64
    grad_accum: int = 8
    max_steps: int = 16
    lr: float = 2e-3
    ema_decay: float = 0.9
    clip: float = 1.0
    timesteps: int = 100
    accum_dtype: torch.dtype = torch.bfloat16
    seed: int = 0


def timestep_embedding(t, dim=32):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


class Denoiser(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.t_proj = nn.Linear(32, hidden)
        self.inp = nn.Linear(2, hidden)
        self.mid = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 2)

    def forward(self, x, t):
        h = self.inp(x) + self.t_proj(timestep_embedding(t))
        return self.out(self.mid(h))


def sample_data(n, gen):
    # mixture of 8 gaussians on a ring
    k = torch.randint(0, 8, (n,), generator=gen)
    ang = k.float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1) * 2.0
    return centers + 0.1 * torch.randn(n, 2, generator=gen)


class DiffusionTrainer:
    def __init__(self, cfg: TrainConfig, rank: int):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(cfg.seed)
        self.model = Denoiser()
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=cfg.lr)
        betas = torch.linspace(1e-4, 0.05, cfg.timesteps)
        self.alpha_bar = torch.cumprod(1 - betas, dim=0)
        self.accum = [torch.zeros_like(p, dtype=self.cfg.accum_dtype) for p in self.params]

    def micro_loss(self, x0, gen):
        t = torch.randint(0, self.cfg.timesteps, (x0.shape[0],), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        ab = self.alpha_bar[t][:, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        return F.mse_loss(self.model(xt, t), noise)

    def accumulate(self, loss):
        grads = torch.autograd.grad(loss, self.params)
        for buf, g in zip(self.accum, grads):
            buf.add_(g.to(buf.dtype))

    def apply_window(self):
        n = self.cfg.grad_accum * self.cfg.world_size
        flat = torch.cat([b.float().reshape(-1) for b in self.accum])
        dist.all_reduce(flat)
        flat.div_(n)
        offset = 0
        for p in self.params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for b in self.accum:
            b.zero_()
        with torch.no_grad():
            for pe, p in zip(self.ema.parameters(), self.model.parameters()):
                pe.lerp_(p, 1 - self.cfg.ema_decay)

    def train(self):
        for step in range(self.cfg.max_steps):
            for micro in range(self.cfg.grad_accum):
                gen = torch.Generator().manual_seed(7919 * step + 31 * micro + 100003 * self.rank)
                x0 = sample_data(self.cfg.micro_batch, gen)
                self.accumulate(self.micro_loss(x0, gen))
            self.apply_window()


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.use_deterministic_algorithms(True)
    trainer = DiffusionTrainer(cfg, rank)
    trainer.train()
    if rank == 0:
        print(f"FINAL_SHA256 {digest(trainer.model)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = TrainConfig()
    mp.spawn(run, args=(cfg,), nprocs=cfg.world_size, join=True)
