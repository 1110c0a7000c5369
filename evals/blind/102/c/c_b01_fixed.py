"""Hinge GAN on a 2-D Gaussian-mixture, two ranks started with mp.spawn.

No DDP wrapper: gradients are averaged by hand right before each optimizer
step (an optimizer step pre-hook), so the K micro-batches of a window are
accumulated locally and exchanged once.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2
PORT = 49212
GRAD_ACCUM = 2
MICRO_BS = 16
N_STEPS = 14
Z_DIM = 8
LR_G = 2e-3
LR_D = 4e-3


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.LeakyReLU(0.2), nn.Linear(h, h), nn.LeakyReLU(0.2), nn.Linear(h, o))


def sample_real(gen, n):
    k = torch.randint(0, 8, (n,), generator=gen).float()
    ang = k * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(ang), torch.sin(ang)], dim=1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


def attach_grad_sync(opt, world):
    """Average the accumulated .grad over ranks right before opt.step()."""

    def _pre_step(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad.div_(world)

    opt.register_step_pre_hook(_pre_step)
    return opt


class GANTrainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        self.G = mlp(Z_DIM, 64, 2)
        self.D = mlp(2, 64, 1)
        self.nets = nn.ModuleDict({"G": self.G, "D": self.D})
        self.opt_g = attach_grad_sync(torch.optim.Adam(self.G.parameters(), lr=LR_G, betas=(0.5, 0.9)), world)
        # the critic uses its own TTUR learning rate and betas (0, 0.9)
        self.opt_d = attach_grad_sync(torch.optim.Adam(self.D.parameters(), lr=LR_D, betas=(0.0, 0.9)), world)
        self.data_gen = torch.Generator().manual_seed(1000 + rank)
        self.z_gen = torch.Generator().manual_seed(2000 + rank)

    def d_window(self):
        self.opt_d.zero_grad(set_to_none=True)
        for _ in range(GRAD_ACCUM):
            real = sample_real(self.data_gen, MICRO_BS)
            with torch.no_grad():
                fake = self.G(torch.randn(MICRO_BS, Z_DIM, generator=self.z_gen))
            loss = torch.relu(1 - self.D(real)).mean() + torch.relu(1 + self.D(fake)).mean()
            (loss / GRAD_ACCUM).backward()
        self.opt_d.step()

    def g_window(self):
        self.opt_g.zero_grad(set_to_none=True)
        for _ in range(GRAD_ACCUM):
            fake = self.G(torch.randn(MICRO_BS, Z_DIM, generator=self.z_gen))
            loss = -self.D(fake).mean()
            (loss / GRAD_ACCUM).backward()
        self.opt_g.step()

    def train(self):
        for _ in range(N_STEPS):
            self.d_window()
            self.g_window()


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = GANTrainer(rank, world)
    trainer.train()
    if rank == 0:
        print(f"FINAL_SHA256 {param_sha(trainer.nets)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD,), nprocs=WORLD, join=True)
