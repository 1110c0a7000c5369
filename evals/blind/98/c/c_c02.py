"""Hinge-loss GAN on 2-D mixture data, two spawned ranks, hand-written gradient sync.

No DDP: after each accumulation window the gradients of the module being trained are
flattened, all-reduced once and divided by the world size. D and G each accumulate
K = 2 micro-batches per update; D is frozen (requires_grad_(False)) while G trains,
so the generator's backward through D leaves D's .grad untouched. D is clipped at
0.5; an EMA copy of G is kept for sampling (not trained).
"""
import copy
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

PORT = 49251
Z_DIM, MB, K, ITERS = 8, 16, 2, 14
EMA_DECAY = 0.9


def mlp(i, o, h=48):
    return nn.Sequential(nn.Linear(i, h), nn.LeakyReLU(0.2), nn.Linear(h, h), nn.LeakyReLU(0.2), nn.Linear(h, o))


def real_batch(n, gen):
    k = torch.randint(0, 8, (n,), generator=gen).float()
    centers = torch.stack([torch.cos(k * math.pi / 4), torch.sin(k * math.pi / 4)], 1) * 2
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


def sync_grads(module, world):
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= world
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


@torch.no_grad()
def ema_update(ema, model, decay):
    for pe, p in zip(ema.parameters(), model.parameters()):
        pe.mul_(decay).add_(p, alpha=1 - decay)


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(11)
    G, D = mlp(Z_DIM, 2), mlp(2, 1)
    G_ema = copy.deepcopy(G).requires_grad_(False)
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.9))
    gen = torch.Generator().manual_seed(77 + rank)

    for it in range(ITERS):
        # ---- discriminator window ------------------------------------------
        D.requires_grad_(True)
        opt_d.zero_grad(set_to_none=True)
        for _ in range(K):
            real = real_batch(MB, gen)
            with torch.no_grad():
                fake = G(torch.randn(MB, Z_DIM, generator=gen))
            d_loss = torch.relu(1 - D(real)).mean() + torch.relu(1 + D(fake)).mean()
            (d_loss / K).backward()
        sync_grads(D, world)
        torch.nn.utils.clip_grad_norm_(D.parameters(), 0.5)
        opt_d.step()

        # ---- generator window (D frozen) -----------------------------------
        D.requires_grad_(False)
        opt_g.zero_grad(set_to_none=True)
        for _ in range(K):
            fake = G(torch.randn(MB, Z_DIM, generator=gen))
            g_loss = -D(fake).mean()
            (g_loss / K).backward()
        sync_grads(G, world)
        opt_g.step()
        ema_update(G_ema, G, EMA_DECAY)

    model = nn.ModuleDict({"G": G, "D": D})
    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
