"""DDPM-style denoiser on 2-D toy data, two ranks spawned here, gradients averaged by hand.

Per-tensor gradient clipping ("clip each parameter's gradient to max_norm") as in some
diffusion codebases; EMA of the weights updated once per optimizer step.
"""
import copy
import hashlib
import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    world_size: int = 2
    port: int = 49231
    seed: int = 3
    micro_batch: int = 32
    grad_accum: int = 4
    train_steps: int = 24
    lr: float = 2e-3
    per_param_max_norm: float = 0.05
    ema_decay: float = 0.95
    timesteps: int = 100
    hidden: int = 64


def sinusoidal(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    ang = t.float()[:, None] * freqs[None]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class Denoiser(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden
        self.t_mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU())
        self.inp = nn.Linear(2, hidden)
        self.body = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.out = nn.Linear(hidden, 2)

    def forward(self, x, t):
        h = self.inp(x) + self.t_mlp(sinusoidal(t, self.hidden))
        return self.out(self.body(h))


class PerParamClipper:
    def __init__(self, max_norm):
        self.max_norm = max_norm

    def clip_(self, p):
        n = p.grad.norm()
        if n > self.max_norm:
            p.grad.mul_(self.max_norm / (n + 1e-6))

    def attach(self, model):
        # clip as soon as each gradient is accumulated, while the rest of backward runs
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.clip_)

    def apply(self, model):
        for p in model.parameters():
            self.clip_(p)


class DiffusionTrainer:
    def __init__(self, cfg: Config, rank: int):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(cfg.seed)
        self.model = Denoiser(cfg.hidden)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        betas = torch.linspace(1e-4, 0.02, cfg.timesteps)
        self.alpha_bar = torch.cumprod(1 - betas, dim=0)
        self.gen = torch.Generator().manual_seed(cfg.seed * 31 + rank)
        self.clipper = PerParamClipper(cfg.per_param_max_norm)
        self.clipper.attach(self.model)

    def sample_data(self):
        n = self.cfg.micro_batch
        theta = torch.rand(n, generator=self.gen) * 2 * math.pi
        r = 1.0 + 0.1 * torch.randn(n, generator=self.gen)
        return torch.stack([r * theta.cos(), r * theta.sin()], dim=1)

    def micro_step(self):
        x0 = self.sample_data()
        t = torch.randint(0, self.cfg.timesteps, (x0.size(0),), generator=self.gen)
        noise = torch.randn(x0.shape, generator=self.gen)
        ab = self.alpha_bar[t][:, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        loss = F.mse_loss(self.model(xt, t), noise)
        (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def sync_grads(self):
        grads = [p.grad for p in self.model.parameters()]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        flat /= self.cfg.world_size
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    @torch.no_grad()
    def update_ema(self):
        for pe, p in zip(self.ema.parameters(), self.model.parameters()):
            pe.lerp_(p, 1 - self.cfg.ema_decay)

    def train(self):
        for step in range(self.cfg.train_steps):
            losses = [self.micro_step() for _ in range(self.cfg.grad_accum)]
            self.sync_grads()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.update_ema()
            if self.rank == 0 and step % 8 == 0:
                print(f"step {step} loss {torch.stack(losses).mean():.4f}")


def run(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    trainer = DiffusionTrainer(cfg, rank)
    trainer.train()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                       os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = Config()
    mp.spawn(run, args=(cfg,), nprocs=cfg.world_size, join=True)
