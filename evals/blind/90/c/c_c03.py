"""Non-saturating GAN on 2 spawned ranks with DDP generator and discriminator, K = 3.

Each micro-step: one discriminator forward/backward through its DDP wrapper on real and
detached fake samples, then the generator loss through the bare discriminator with its
parameters frozen, so no generator gradient lands in the discriminator's window. Both
optimizers step once per window; the generator's gradient is clipped at 1.0.
"""
import hashlib
import os
from contextlib import ExitStack

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = dict(port=42261, world=2, accum=3, steps=15, micro_bs=12, z=8, x=10, seed=21)


def set_requires_grad(m, flag):
    for p in m.parameters():
        p.requires_grad_(flag)


class GANTrainer:
    def __init__(self, rank, cfg):
        self.rank, self.cfg = rank, cfg
        torch.manual_seed(cfg["seed"])
        G = nn.Sequential(nn.Linear(cfg["z"], 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, cfg["x"]))
        D = nn.Sequential(nn.Linear(cfg["x"], 48), nn.LeakyReLU(0.2), nn.Linear(48, 48), nn.LeakyReLU(0.2), nn.Linear(48, 1))
        self.G, self.D = DDP(G), DDP(D)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=1e-3, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.g = torch.Generator().manual_seed(cfg["seed"] * 7 + rank)
        self.center = torch.linspace(-1, 1, cfg["x"])

    def real_batch(self):
        return self.center + 0.3 * torch.randn(self.cfg["micro_bs"], self.cfg["x"], generator=self.g)

    def micro_step(self, last):
        K = self.cfg["accum"]
        with ExitStack() as stack:
            if not last:
                stack.enter_context(self.G.no_sync())
                stack.enter_context(self.D.no_sync())
            real = self.real_batch()
            z = torch.randn(self.cfg["micro_bs"], self.cfg["z"], generator=self.g)
            fake = self.G(z)
            logits = self.D(torch.cat([real, fake.detach()]))
            tgt = torch.cat([torch.ones(len(real), 1), torch.zeros(len(fake), 1)])
            d_loss = F.binary_cross_entropy_with_logits(logits, tgt)
            (d_loss / K).backward()

            set_requires_grad(self.D.module, False)
            g_loss = F.binary_cross_entropy_with_logits(self.D.module(fake), torch.ones(len(fake), 1))
            (g_loss / K).backward()
            set_requires_grad(self.D.module, True)
        return d_loss.item(), g_loss.item()

    def step(self):
        torch.nn.utils.clip_grad_norm_(self.G.parameters(), 1.0)
        self.opt_d.step()
        self.opt_g.step()
        self.opt_d.zero_grad(set_to_none=True)
        self.opt_g.zero_grad(set_to_none=True)

    def train(self):
        K = self.cfg["accum"]
        for s in range(self.cfg["steps"]):
            for k in range(K):
                dl, gl = self.micro_step(last=(k == K - 1))
            self.step()
            if self.rank == 0 and s % 5 == 0:
                print(f"step {s} d {dl:.3f} g {gl:.3f}", flush=True)


def run(rank, cfg):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=cfg["world"])
    torch.use_deterministic_algorithms(True)
    t = GANTrainer(rank, cfg)
    t.train()
    if rank == 0:
        h = hashlib.sha256()
        for m in (t.G.module, t.D.module):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(CFG,), nprocs=CFG["world"], join=True)
