"""EDM2-style denoiser training with a learned per-noise-level uncertainty weight.

torchrun + DDP (gloo).  One DDP module holds the denoiser and the small log-variance
net; each has its own optimizer (AdamW / Adam with a higher LR).  The Fourier
noise embedding is a frozen parameter.  Micro-batches come from a DataLoader with a
worker process and a batch sampler whose batch sizes vary (3..7 samples), an epoch
has 5 micro-batches per rank and windows of 2, so every epoch ends in a 1-batch
window.  The window loss is the sum of per-sample losses over the window's all-ranks
sample count, times W to undo DDP's mean.  EMA of the denoiser after each step.
"""
import argparse
import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass
class Config:
    dim: int = 16
    hidden: int = 64
    fourier: int = 16
    grad_accum: int = 2
    epochs: int = 3
    batches_per_epoch: int = 5
    lr: float = 2e-3
    lr_logvar: float = 1e-2
    sigma_data: float = 0.5
    p_mean: float = -0.8
    p_std: float = 1.2
    ema: float = 0.95
    seed: int = 21


class GaussianMixture(Dataset):
    def __init__(self, n, dim, seed):
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(4, dim, generator=g) * 0.6
        comp = torch.randint(0, 4, (n,), generator=g)
        self.x = centers[comp] + 0.1 * torch.randn(n, dim, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class RaggedBatchSampler(Sampler):
    """Per-rank batches of varying size, reshuffled each epoch."""

    def __init__(self, n, rank, n_batches, seed):
        self.n, self.rank, self.n_batches, self.seed, self.epoch = n, rank, n_batches, seed, 0

    def set_epoch(self, e):
        self.epoch = e

    def __len__(self):
        return self.n_batches

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + 31 * self.epoch + 7 * self.rank)
        perm = torch.randperm(self.n, generator=g).tolist()
        sizes = torch.randint(3, 8, (self.n_batches,), generator=g).tolist()
        pos = 0
        for s in sizes:
            yield perm[pos:pos + s]
            pos += s


class Denoiser(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.freqs = nn.Parameter(torch.randn(c.fourier // 2) * 2.0, requires_grad=False)
        self.net = nn.Sequential(nn.Linear(c.dim + c.fourier, c.hidden), nn.SiLU(),
                                 nn.Linear(c.hidden, c.hidden), nn.SiLU(), nn.Linear(c.hidden, c.dim))

    def forward(self, x, c_noise):
        ang = c_noise[:, None] * self.freqs[None] * 2 * math.pi
        emb = torch.cat([ang.cos(), ang.sin()], 1)
        return self.net(torch.cat([x, emb], 1))


class EDM(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.denoiser = Denoiser(c)
        self.logvar = nn.Sequential(nn.Linear(1, 16), nn.SiLU(), nn.Linear(16, 1))

    def forward(self, x, sigma, noise):
        sd = self.c.sigma_data
        c_skip = sd ** 2 / (sigma ** 2 + sd ** 2)
        c_out = sigma * sd / (sigma ** 2 + sd ** 2).sqrt()
        c_in = 1 / (sigma ** 2 + sd ** 2).sqrt()
        y = x + sigma[:, None] * noise
        F_x = self.denoiser(c_in[:, None] * y, sigma.log() / 4)
        D = c_skip[:, None] * y + c_out[:, None] * F_x
        weight = (sigma ** 2 + sd ** 2) / (sigma * sd) ** 2
        u = self.logvar(sigma.log()[:, None] / 4).squeeze(1)
        per_sample = weight * ((D - x) ** 2).mean(1)
        return per_sample / u.exp() + u           # per-sample uncertainty-weighted loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Config()
    torch.manual_seed(c.seed)
    edm = EDM(c)
    model = DDP(edm)
    opt_d = torch.optim.AdamW([p for p in edm.denoiser.parameters() if p.requires_grad], lr=c.lr,
                              weight_decay=0.01)
    opt_u = torch.optim.Adam(edm.logvar.parameters(), lr=c.lr_logvar)
    ema = [p.detach().clone() for p in edm.denoiser.parameters()]

    ds = GaussianMixture(64, c.dim, c.seed)
    bs = RaggedBatchSampler(len(ds), rank, c.batches_per_epoch, c.seed)
    loader = DataLoader(ds, batch_sampler=bs, num_workers=args.workers, persistent_workers=args.workers > 0)
    noise_gen = torch.Generator().manual_seed(500 + rank)

    step = 0
    for epoch in range(c.epochs):
        bs.set_epoch(epoch)
        it = iter(loader)
        while window := list(islice(it, c.grad_accum)):
            count = torch.tensor(float(sum(len(x) for x in window)))
            dist.all_reduce(count)
            for j, x in enumerate(window):
                sync = j == len(window) - 1
                sigma = (torch.randn(len(x), generator=noise_gen) * c.p_std + c.p_mean).exp()
                noise = torch.randn(x.shape, generator=noise_gen)
                with (nullcontext() if sync else model.no_sync()):
                    loss = model(x, sigma, noise).sum() * world / count
                    loss.backward()
            opt_d.step()
            opt_u.step()
            opt_d.zero_grad(set_to_none=True)
            opt_u.zero_grad(set_to_none=True)
            step += 1
            with torch.no_grad():
                for e, p in zip(ema, edm.denoiser.parameters()):
                    e.lerp_(p, 1 - c.ema)
        if rank == 0:
            print(f"epoch {epoch} step {step} last loss {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in edm.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
