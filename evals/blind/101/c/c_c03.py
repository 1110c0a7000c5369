"""DDPM-style denoiser on 2 DDP ranks (torchrun) with bf16 autocast.

fp32 master weights, bf16 autocast forward, gradients accumulated in fp32 .grad.
A DataLoader with 2 worker processes over a DistributedSampler; every micro-batch
has the same size, 10 micro-batches per rank per epoch and K = 4, so windows are
4, 4, 2 and each loss is divided by the number of micro-batches in its window.
The sinusoidal time table is a frozen parameter; an EMA copy is kept for sampling.
"""
import copy
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

GRAD_ACCUM = 4
MICRO_BS = 6
EPOCHS = 2
T_STEPS = 100
DIM = 12
SEED = 3


class Points(Dataset):
    """Synthetic 12-d data on a few noisy clusters."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        centers = torch.randn(4, DIM, generator=g) * 2
        idx = torch.randint(0, 4, (n,), generator=g)
        self.x = centers[idx] + 0.2 * torch.randn(n, DIM, generator=g)

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i]


def sinusoid_table(T, d):
    pos = torch.arange(T).float()[:, None]
    freq = torch.exp(-math.log(10000) * torch.arange(0, d, 2).float() / d)
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=-1)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.t_table = nn.Parameter(sinusoid_table(T_STEPS, 16), requires_grad=False)
        self.t_mlp = nn.Sequential(nn.Linear(16, 32), nn.SiLU())
        self.net = nn.Sequential(nn.Linear(DIM + 32, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(),
                                 nn.Linear(64, DIM))

    def forward(self, x_t, t):
        return self.net(torch.cat([x_t, self.t_mlp(self.t_table[t])], dim=-1))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)

    betas = torch.linspace(1e-4, 0.05, T_STEPS)
    alpha_bar = torch.cumprod(1 - betas, 0)

    model = Denoiser()
    ema = copy.deepcopy(model).requires_grad_(False)
    ddp = DDP(model)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)

    ds = Points(world * MICRO_BS * 10)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, num_workers=2,
                        persistent_workers=True)
    n_micro = len(loader)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        noise_gen = torch.Generator().manual_seed(SEED * 1000 + epoch * 10 + rank)
        for i, x0 in enumerate(loader):
            window_start = (i // GRAD_ACCUM) * GRAD_ACCUM
            window_len = min(GRAD_ACCUM, n_micro - window_start)
            boundary = (i + 1) % GRAD_ACCUM == 0 or i + 1 == n_micro
            t = torch.randint(0, T_STEPS, (x0.shape[0],), generator=noise_gen)
            eps = torch.randn(x0.shape, generator=noise_gen)
            ab = alpha_bar[t][:, None]
            x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
            ddp.require_backward_grad_sync = boundary
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pred = ddp(x_t, t)
            loss = F.mse_loss(pred.float(), eps)
            (loss / window_len).backward()
            if boundary:
                opt.step()
                opt.zero_grad(set_to_none=True)
                with torch.no_grad():
                    for pe, p in zip(ema.parameters(), model.parameters()):
                        pe.mul_(0.95).add_(p, alpha=0.05)
                if rank == 0:
                    print(f"epoch {epoch} micro {i} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
