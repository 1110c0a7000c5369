"""Masked-diffusion inpainting denoiser (DDPM epsilon objective on the hole only).

torchrun, 2 ranks, DDP with the sync deferred to the window's last micro-batch.
The loss is the squared error summed over the hole pixels of the whole window
divided by the number of hole pixels in it.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Config:
    dim: int = 32
    hidden: int = 96
    micro_bs: int = 6
    grad_accum: int = 4
    updates: int = 12
    lr: float = 2e-3
    timesteps: int = 100
    clip: float = 5.0
    seed: int = 7


def cosine_alpha_bar(T):
    s = 0.008
    t = torch.linspace(0, T, T + 1) / T
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return (f / f[0])[1:]


class Denoiser(nn.Module):
    def __init__(self, dim, hidden, T):
        super().__init__()
        self.t_emb = nn.Embedding(T, hidden)
        self.inp = nn.Linear(2 * dim + dim, hidden)   # noisy x, known context, mask
        self.mid = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, dim)

    def forward(self, x_t, context, mask, t):
        h = self.inp(torch.cat([x_t, context, mask], -1)) + self.t_emb(t)
        return self.out(self.mid(h))


class InpaintDataset:
    """Each rank owns its own shard; hole sizes vary per image."""

    def __init__(self, cfg, rank):
        g = torch.Generator().manual_seed(100 + rank)
        n = cfg.updates * cfg.grad_accum * cfg.micro_bs
        base = torch.randn(n, 1, generator=g) * torch.linspace(-1, 1, cfg.dim)
        self.x0 = torch.tanh(base + 0.3 * torch.randn(n, cfg.dim, generator=g))
        # shards come from two mask generators: thin strokes (even ranks), large boxes (odd ranks)
        lo, hi = (0.05, 0.3) if rank % 2 == 0 else (0.3, 0.9)
        hole_frac = lo + (hi - lo) * torch.rand(n, 1, generator=g)
        self.mask = (torch.rand(n, cfg.dim, generator=g) < hole_frac).float()
        self.t = torch.randint(0, cfg.timesteps, (n,), generator=g)
        self.noise = torch.randn(n, cfg.dim, generator=g)
        self.bs = cfg.micro_bs

    def batches(self):
        for i in range(0, len(self.x0), self.bs):
            sl = slice(i, i + self.bs)
            yield dict(x0=self.x0[sl], mask=self.mask[sl], t=self.t[sl], noise=self.noise[sl])


class InpaintTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = Denoiser(cfg.dim, cfg.hidden, cfg.timesteps)
        self.ddp = DDP(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
        self.alpha_bar = cosine_alpha_bar(cfg.timesteps)
        self.data = InpaintDataset(cfg, self.rank)

    def count_targets(self, window):
        return torch.stack([mb["mask"].sum() for mb in window]).sum()

    def micro_step(self, mb, n_targets, sync):
        self.ddp.require_backward_grad_sync = sync
        ab = self.alpha_bar[mb["t"]].unsqueeze(-1)
        x_t = ab.sqrt() * mb["x0"] + (1 - ab).sqrt() * mb["noise"]
        x_t = mb["mask"] * x_t + (1 - mb["mask"]) * mb["x0"]
        context = (1 - mb["mask"]) * mb["x0"]
        eps_hat = self.ddp(x_t, context, mb["mask"], mb["t"])
        sq = (eps_hat - mb["noise"]).pow(2) * mb["mask"]
        loss = sq.sum() / n_targets
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        it = self.data.batches()
        K = self.cfg.grad_accum
        for update in range(self.cfg.updates):
            window = [next(it) for _ in range(K)]
            n_targets = self.count_targets(window)
            total = 0.0
            for i, mb in enumerate(window):
                total += self.micro_step(mb, n_targets, sync=(i == K - 1)).item()
            self.optimizer_step()
            if self.rank == 0 and update % 4 == 0:
                print(f"update {update} loss {total:.4f}", flush=True)

    def digest(self):
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in self.model.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = InpaintTrainer(Config())
    trainer.fit()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", trainer.digest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
