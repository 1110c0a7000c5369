"""Non-saturating GAN on 2 spawned ranks with hand-averaged gradients.

Discriminator and generator each accumulate K = 2 micro-batches per update,
their gradients are averaged over the ranks by hand, and an EMA copy of the
generator is kept for sampling (not part of the trained parameters).
"""
import copy
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD, K, UPDATES, MB, ZDIM, XDIM = 2, 2, 10, 16, 8, 12
PORT = 46208


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(ZDIM, 64), nn.LeakyReLU(0.2), nn.Linear(64, XDIM))
        self.disc = nn.Sequential(nn.Linear(XDIM, 64), nn.LeakyReLU(0.2), nn.Linear(64, 32),
                                  nn.LeakyReLU(0.2), nn.Linear(32, 1))


def real_samples(g, n):
    centers = torch.tensor([[2.0] * XDIM, [-2.0] * XDIM, [0.0] * XDIM])
    idx = torch.randint(0, 3, (n,), generator=g)
    return centers[idx] + 0.3 * torch.randn(n, XDIM, generator=g)


def all_average(module, world):
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


@torch.no_grad()
def ema_update(ema, model, decay=0.9):
    for pe, p in zip(ema.parameters(), model.parameters()):
        pe.lerp_(p, 1 - decay)


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    gan = GAN()
    G, D = gan.gen, gan.disc
    G_ema = copy.deepcopy(G).requires_grad_(False)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(77 + rank)
    ones, zeros = torch.ones(MB, 1), torch.zeros(MB, 1)

    for update in range(UPDATES):
        # discriminator window
        opt_d.zero_grad(set_to_none=True)
        for _ in range(K):
            real = real_samples(g, MB)
            with torch.no_grad():
                fake = G(torch.randn(MB, ZDIM, generator=g))
            d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + \
                F.binary_cross_entropy_with_logits(D(fake), zeros)
            (d_loss / K).backward()
        all_average(D, WORLD)
        opt_d.step()

        # generator window (D's .grad gets written too; cleared before D's next window)
        opt_g.zero_grad(set_to_none=True)
        for _ in range(K):
            fake = G(torch.randn(MB, ZDIM, generator=g))
            g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
            (g_loss / K).backward()
        all_average(G, WORLD)
        opt_g.step()
        ema_update(G_ema, G)
        if rank == 0 and update % 3 == 0:
            print(f"update {update} d {d_loss.item():.3f} g {g_loss.item():.3f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in gan.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    mp.spawn(worker, nprocs=WORLD, join=True)
