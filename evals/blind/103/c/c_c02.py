"""Non-saturating GAN on 2 spawned DDP ranks with gradient accumulation.

Per update: K discriminator micro-steps (fake samples detached), one D step with a
clip; then K generator micro-steps through the bare discriminator (its parameters
frozen for that phase, so DDP(D) has nothing to reduce), one G step.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

Z, X, H = 8, 2, 64
MB, K, UPDATES = 32, 2, 25
PORT = 49243
WORLD = 2


def real_batch(gen):
    ang = torch.rand(MB, generator=gen) * 6.2831853
    ring = torch.stack([ang.cos(), ang.sin()], 1) * 2.0
    return ring + 0.05 * torch.randn(MB, X, generator=gen)


def mlp(i, o):
    return nn.Sequential(nn.Linear(i, H), nn.LeakyReLU(0.2), nn.Linear(H, H), nn.LeakyReLU(0.2), nn.Linear(H, o))


def sync_ctx(ddp_model, is_last):
    return ddp_model.no_sync() if not is_last else torch.enable_grad()


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    G = DDP(mlp(Z, X))
    D = DDP(mlp(X, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(100 + rank)

    for it in range(UPDATES):
        # ---- discriminator window ----
        for k in range(K):
            with sync_ctx(D, k == K - 1):
                real = real_batch(gen)
                with torch.no_grad():
                    fake = G(torch.randn(MB, Z, generator=gen))
                logits = D(torch.cat([real, fake]))
                labels = torch.cat([torch.ones(MB, 1), torch.zeros(MB, 1)])
                d_loss = F.binary_cross_entropy_with_logits(logits, labels) / K
                d_loss.backward()
        d_norm = torch.nn.utils.clip_grad_norm_(D.parameters(), 0.3)
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)

        # ---- generator window ----
        D.module.requires_grad_(False)
        for k in range(K):
            with sync_ctx(G, k == K - 1):
                fake = G(torch.randn(MB, Z, generator=gen))
                g_loss = F.softplus(-D.module(fake)).mean() / K
                g_loss.backward()
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        D.module.requires_grad_(True)

        if rank == 0 and (it + 1) % 5 == 0:
            print(f"it {it + 1} d {d_loss.item() * K:.3f} g {g_loss.item() * K:.3f} |gD| {d_norm:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for m in (G.module, D.module):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
