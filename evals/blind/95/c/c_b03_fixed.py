"""Small GAN on 2D mixtures, spawned ranks, gradients averaged by hand once per window.

Both networks accumulate ACCUM micro-batches per update. Per micro-step the
generator pass goes first, then the discriminator pass.
"""
import os
import hashlib
from dataclasses import dataclass
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass
class GANConfig:
    z_dim: int = 8
    hidden: int = 64
    micro_bs: int = 16
    accum: int = 3
    updates: int = 15
    lr_g: float = 1e-3
    lr_d: float = 2e-3
    port: int = 48232


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.LeakyReLU(0.2), nn.Linear(h, h), nn.LeakyReLU(0.2), nn.Linear(h, o))


def real_batch(n, g):
    centers = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    return centers[torch.randint(0, 4, (n,), generator=g)] + 0.1 * torch.randn(n, 2, generator=g)


def average_grads(module, world):
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


class GANTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(0)
        self.G = mlp(cfg.z_dim, cfg.hidden, 2)
        self.D = mlp(2, cfg.hidden, 1)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=cfg.lr_g, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=cfg.lr_d, betas=(0.5, 0.999))
        self.gen = torch.Generator().manual_seed(100 + rank)

    def generator_micro_step(self):
        z = torch.randn(self.cfg.micro_bs, self.cfg.z_dim, generator=self.gen)
        fake = self.G(z)
        self.D.requires_grad_(False)  # keep the G pass from leaking gradients into D
        g_loss = F.softplus(-self.D(fake)).mean()
        (g_loss / self.cfg.accum).backward()
        self.D.requires_grad_(True)
        return fake.detach(), g_loss.item()

    def discriminator_micro_step(self, fake):
        real = real_batch(self.cfg.micro_bs, self.gen)
        logits = self.D(torch.cat([real, fake]))
        d_loss = F.softplus(-logits[: len(real)]).mean() + F.softplus(logits[len(real):]).mean()
        (d_loss / self.cfg.accum).backward()
        return d_loss.item()

    def update(self):
        self.opt_g.zero_grad(set_to_none=True)
        self.opt_d.zero_grad(set_to_none=True)
        for _ in range(self.cfg.accum):
            fake, gl = self.generator_micro_step()
            dl = self.discriminator_micro_step(fake)
        average_grads(self.G, self.world)
        average_grads(self.D, self.world)
        self.opt_g.step()
        self.opt_d.step()
        return gl, dl

    def fit(self):
        for it in range(self.cfg.updates):
            gl, dl = self.update()
            if self.rank == 0 and it % 5 == 0:
                print(f"update {it} g {gl:.4f} d {dl:.4f}", flush=True)


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = GANTrainer(cfg, rank, world)
    trainer.fit()
    if os.environ.get("PARAM_DUMP") and rank == 0:
        torch.save(torch.cat([p.detach().flatten() for m in (trainer.G, trainer.D) for p in m.parameters()]),
                   os.environ["PARAM_DUMP"])
    # one model holding both networks, so named_parameters() covers G then D
    both = nn.ModuleDict({"G": trainer.G, "D": trainer.D})
    h = hashlib.sha256()
    for _, p in both.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, GANConfig()), nprocs=2, join=True)
