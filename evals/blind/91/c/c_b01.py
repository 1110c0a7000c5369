"""DCGAN-style training on 2 spawned ranks (gloo), hand-written gradient averaging.

Each optimizer step of D and of G sees K micro-batches per rank (large batch K*W*MB).
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD_SIZE = 2
PORT = 43211
ACCUM = 3          # micro-batches per update
STEPS = 10         # updates of D and of G
MICRO_BS = 16
NZ = 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(NZ, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, x):
        return self.main(x).squeeze(-1)


def sample_real(n, gen):
    # mixture of 4 gaussians on a ring
    centers = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * 2.0
    idx = torch.randint(0, 4, (n,), generator=gen)
    return centers[idx] + 0.1 * torch.randn(n, 2, generator=gen)


def all_reduce_mean_grads(module):
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(WORLD_SIZE)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    netG, netD = Generator(), Discriminator()
    gan = nn.ModuleDict({"G": netG, "D": netD})
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    data_gen = torch.Generator().manual_seed(1234 + rank)

    real_label, fake_label = 1.0, 0.0
    for it in range(STEPS):
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        optimizerD.zero_grad(set_to_none=True)
        for _ in range(ACCUM):
            real = sample_real(MICRO_BS, data_gen)
            label = torch.full((MICRO_BS,), real_label)
            errD_real = criterion(netD(real), label)
            noise = torch.randn(MICRO_BS, NZ, generator=data_gen)
            fake = netG(noise)
            label_fake = torch.full((MICRO_BS,), fake_label)
            errD_fake = criterion(netD(fake.detach()), label_fake)
            ((errD_real + errD_fake) / ACCUM).backward()
        all_reduce_mean_grads(netD)
        optimizerD.step()

        ############################
        # (2) Update G network: maximize log(D(G(z)))
        ###########################
        netD.requires_grad_(False)
        for _ in range(ACCUM):
            netG.zero_grad()
            noise = torch.randn(MICRO_BS, NZ, generator=data_gen)
            label = torch.full((MICRO_BS,), real_label)
            errG = criterion(netD(netG(noise)), label)
            (errG / ACCUM).backward()
        netD.requires_grad_(True)
        all_reduce_mean_grads(netG)
        optimizerG.step()

    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat([p.detach().float().flatten() for p in gan.parameters()]), os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(gan)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD_SIZE, join=True)
