"""Tiny DDPM-style denoiser on 2 spawned ranks (DDP, gloo) with gradient accumulation."""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
PORT = 42211
ACCUM = 4
STEPS = 20
MICRO_BS = 8
DIM = 16
T = 50


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.temb = nn.Embedding(T, 32)
        self.net = nn.Sequential(
            nn.Linear(DIM + 32, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, DIM)
        )

    def forward(self, x, t):
        return self.net(torch.cat([x, self.temb(t)], dim=-1))


class DiffusionTrainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.model = DDP(Denoiser())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.01)
        betas = torch.linspace(1e-4, 0.02, T)
        self.abar = torch.cumprod(1.0 - betas, dim=0)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        self.micro = 0

    def next_batch(self):
        g = self.gen
        x0 = torch.randn(MICRO_BS, DIM, generator=g) * 0.5 + torch.sin(torch.arange(DIM).float())
        t = torch.randint(0, T, (MICRO_BS,), generator=g)
        eps = torch.randn(MICRO_BS, DIM, generator=g)
        return x0, t, eps

    def p_losses(self, x0, t, eps):
        a = self.abar[t].unsqueeze(-1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        return F.mse_loss(self.model(xt, t), eps)

    def sync_context(self):
        # only all-reduce on one backward per window
        if self.micro % ACCUM != 0:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def micro_step(self):
        x0, t, eps = self.next_batch()
        with self.sync_context():
            loss = self.p_losses(x0, t, eps) / ACCUM
            loss.backward()
        self.micro += 1
        return loss.item()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for step in range(STEPS):
            tot = 0.0
            for _ in range(ACCUM):
                tot += self.micro_step()
            self.optimizer_step()
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {tot:.4f}", flush=True)


def sha_of(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)
    tr = DiffusionTrainer(rank)
    tr.fit()
    if rank == 0:
        print(f"FINAL_SHA256 {sha_of(tr.model.module)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
