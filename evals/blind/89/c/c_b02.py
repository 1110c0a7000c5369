"""Tiny DDPM trainer (epsilon prediction) on 2 DDP ranks, launched with torchrun.

The trainer is split over methods: `train_step` runs one micro-batch,
`optimizer_step` closes a window of `grad_accum` micro-batches, and a periodic
`evaluate` computes a held-out denoising loss. EMA weights are kept for sampling.
"""
import argparse
import contextlib
import copy
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--timesteps", type=int, default=50)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--eval-every", type=int, default=6, help="in micro-batches")
    return p.parse_args()


class TimeEmbed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t):
        half = self.dim // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)
        ang = t.float()[:, None] * freqs[None]
        return torch.cat([ang.sin(), ang.cos()], -1)


class Denoiser(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.temb = TimeEmbed(hidden)
        self.inp = nn.Linear(dim, hidden)
        self.block = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.out = nn.Linear(hidden, dim)

    def forward(self, x, t):
        h = self.inp(x) + self.temb(t)
        return self.out(h + self.block(h))


class DiffusionTrainer:
    def __init__(self, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        torch.manual_seed(0)
        net = Denoiser(args.dim, args.hidden)
        self.ema = copy.deepcopy(net).requires_grad_(False)
        self.model = DDP(net)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        betas = torch.linspace(1e-4, 0.05, args.timesteps)
        self.alpha_bar = torch.cumprod(1 - betas, 0)
        g = torch.Generator().manual_seed(7)
        self.mu = torch.randn(4, args.dim, generator=g) * 2
        self.data_gen = torch.Generator().manual_seed(100 + rank)
        self.eval_gen = torch.Generator().manual_seed(999)
        self.micro_step = 0
        self.global_step = 0

    def sample_batch(self, gen, n):
        comp = torch.randint(0, 4, (n,), generator=gen)
        x0 = self.mu[comp] + 0.3 * torch.randn(n, self.args.dim, generator=gen)
        t = torch.randint(0, self.args.timesteps, (n,), generator=gen)
        noise = torch.randn(n, self.args.dim, generator=gen)
        ab = self.alpha_bar[t][:, None]
        return ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t, noise

    def train_step(self):
        xt, t, noise = self.sample_batch(self.data_gen, self.args.micro_batch)
        boundary = (self.micro_step + 1) % self.args.grad_accum == 0
        ctx = contextlib.nullcontext() if boundary else self.model.no_sync()
        with ctx:
            loss = F.mse_loss(self.model(xt, t), noise) / self.args.grad_accum
            loss.backward()
        self.micro_step += 1
        if boundary:
            self.optimizer_step()
        if self.micro_step % self.args.eval_every == 0:
            self.evaluate()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, p in zip(self.ema.parameters(), self.model.module.parameters()):
                pe.lerp_(p, 1 - self.args.ema)
        self.global_step += 1

    @torch.no_grad()
    def evaluate(self):
        # free gradient memory before the held-out pass
        self.model.zero_grad(set_to_none=True)
        self.model.eval()
        xt, t, noise = self.sample_batch(self.eval_gen, 64)
        val = F.mse_loss(self.model.module(xt, t), noise)
        self.model.train()
        self.last_val = val.item()

    def fit(self):
        while self.global_step < self.args.max_steps:
            self.train_step()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    trainer = DiffusionTrainer(args, rank, world)
    trainer.fit()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
