"""Non-saturating GAN with an R1 penalty on the real samples (StyleGAN2-ish), toy 2-D data.

Two ranks spawned in-process, gloo, gradients averaged by hand at each window boundary.
Each optimizer step of D and of G covers ACCUM micro-batches per rank.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 49202
ACCUM = 3
ITERS = 10          # D step + G step per iteration -> 20 optimizer steps
MICRO_BS = 16
Z_DIM = 8
X_DIM = 16
R1_GAMMA = 2.0


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.LeakyReLU(0.2), nn.Linear(h, h), nn.LeakyReLU(0.2), nn.Linear(h, o))


class RealData:
    """Mixture of gaussians in X_DIM dims, one stream per rank."""

    def __init__(self, rank, seed=1234):
        self.g = torch.Generator().manual_seed(seed + 97 * rank)
        self.centers = torch.randn(4, X_DIM, generator=torch.Generator().manual_seed(seed)) * 2.0

    def sample(self, n):
        idx = torch.randint(0, 4, (n,), generator=self.g)
        return self.centers[idx] + 0.3 * torch.randn(n, X_DIM, generator=self.g)


def average_grads(module, world):
    for p in module.parameters():
        if p.grad is None:
            continue
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world)


def d_micro_step(D, G, real, z):
    with torch.no_grad():
        fake = G(z)
    real = real.detach().requires_grad_(True)
    d_real = D(real)
    d_fake = D(fake)

    # R1: || d D(x) / d x ||^2 on the real samples
    (grad_real,) = torch.autograd.grad(d_real.sum(), real, create_graph=True)
    r1 = grad_real.pow(2).sum(dim=1).mean()

    loss = F.softplus(d_fake).mean() + F.softplus(-d_real).mean() + 0.5 * R1_GAMMA * r1
    (loss / ACCUM).backward()
    return loss.detach()


def g_micro_step(D, G, z):
    loss = F.softplus(-D(G(z))).mean()
    (loss / ACCUM).backward()
    return loss.detach()


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    G = mlp(Z_DIM, 64, X_DIM)
    D = mlp(X_DIM, 64, 1)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.0, 0.99))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.0, 0.99))

    data = RealData(rank)
    zgen = torch.Generator().manual_seed(555 + rank)

    for it in range(ITERS):
        # ---- discriminator window ----
        D.requires_grad_(True)
        opt_d.zero_grad(set_to_none=True)
        for _ in range(ACCUM):
            d_micro_step(D, G, data.sample(MICRO_BS), torch.randn(MICRO_BS, Z_DIM, generator=zgen))
        average_grads(D, WORLD)
        opt_d.step()

        # ---- generator window ----
        D.requires_grad_(False)
        opt_g.zero_grad(set_to_none=True)
        for _ in range(ACCUM):
            gl = g_micro_step(D, G, torch.randn(MICRO_BS, Z_DIM, generator=zgen))
        average_grads(G, WORLD)
        opt_g.step()
        if rank == 0 and it % 5 == 0:
            print(f"it {it} g_loss {gl.item():.4f}", flush=True)

    D.requires_grad_(True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in nn.ModuleDict({"G": G, "D": D}).named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
