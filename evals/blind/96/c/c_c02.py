"""DDPM-style denoiser on 2-D toy data, 2 DDP ranks, with EMA and a preemption/resume.

- LR: CosineAnnealingWarmRestarts driven by the *fractional epoch* (the pattern from the
  PyTorch docs, ``scheduler.step(epoch + i / iters)``), called for every micro-batch; the LR
  is a pure function of the data position, so the optimizer sees the same LR at each update.
- The run is interrupted after PHASE1_UPDATES, everything is checkpointed at that window
  boundary, all objects are rebuilt from the file and training continues.
"""
import copy
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Cfg:
    micro_bs = 16
    accum = 3
    iters_per_epoch = 12          # micro-batches per rank per epoch
    epochs = 3                    # -> 36 micro-batches -> 12 updates
    phase1_updates = 5
    lr = 2e-3
    T0 = 1
    timesteps = 100
    ema_decay = 0.9
    seed = 99
    ckpt = os.path.join(tempfile.gettempdir(), f"c_c02_ckpt_{os.environ.get('MASTER_PORT', '0')}.pt")


def betas_alphas(T):
    betas = torch.linspace(1e-4, 0.05, T)
    return torch.cumprod(1 - betas, 0)


class Denoiser(nn.Module):
    def __init__(self, T, hidden=64):
        super().__init__()
        self.t_embed = nn.Embedding(T, hidden)
        self.inp = nn.Linear(2, hidden)
        self.mid = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 2)

    def forward(self, x, t):
        return self.out(self.mid(self.inp(x) + self.t_embed(t)))


def micro_batch(rank, global_micro, cfg):
    """Data for micro-batch number `global_micro` of this rank (position-addressed: resumable)."""
    g = torch.Generator().manual_seed(cfg.seed * 100003 + rank * 7919 + global_micro)
    theta = torch.rand(cfg.micro_bs, generator=g) * 2 * math.pi
    x0 = torch.stack([torch.cos(theta), torch.sin(theta)], 1) * (1 + 0.1 * torch.randn(cfg.micro_bs, 1, generator=g))
    t = torch.randint(0, cfg.timesteps, (cfg.micro_bs,), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    return x0, t, noise


class Run:
    def __init__(self, cfg, rank):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(cfg.seed)
        net = Denoiser(cfg.timesteps)
        self.ema = copy.deepcopy(net).requires_grad_(False)
        self.model = DDP(net)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(self.opt, T_0=cfg.T0, eta_min=1e-4)
        self.abar = betas_alphas(cfg.timesteps)
        self.micro = 0
        self.updates = 0

    def state_dict(self):
        return dict(model=self.model.module.state_dict(), ema=self.ema.state_dict(),
                    opt=self.opt.state_dict(), sched=self.sched.state_dict(),
                    micro=self.micro, updates=self.updates)

    def load_state_dict(self, sd):
        self.model.module.load_state_dict(sd["model"])
        self.ema.load_state_dict(sd["ema"])
        self.opt.load_state_dict(sd["opt"])
        self.sched.load_state_dict(sd["sched"])
        self.micro, self.updates = sd["micro"], sd["updates"]

    @torch.no_grad()
    def ema_update(self):
        for pe, p in zip(self.ema.parameters(), self.model.module.parameters()):
            pe.lerp_(p, 1 - self.cfg.ema_decay)

    def train_until(self, n_updates):
        cfg = self.cfg
        while self.updates < n_updates:
            epoch, i = divmod(self.micro, cfg.iters_per_epoch)
            self.sched.step(epoch + i / cfg.iters_per_epoch)
            x0, t, noise = micro_batch(self.rank, self.micro, cfg)
            a = self.abar[t].unsqueeze(1)
            xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
            boundary = (self.micro + 1) % cfg.accum == 0
            if boundary:
                loss = F.mse_loss(self.model(xt, t), noise) / cfg.accum
                loss.backward()
            else:
                with self.model.no_sync():
                    loss = F.mse_loss(self.model(xt, t), noise) / cfg.accum
                    loss.backward()
            self.micro += 1
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                self.ema_update()
                self.updates += 1
                if self.rank == 0:
                    print(f"update {self.updates} lr {self.opt.param_groups[0]['lr']:.5f} "
                          f"loss {loss.item() * cfg.accum:.4f}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = Cfg()
    total = cfg.epochs * cfg.iters_per_epoch // cfg.accum

    run = Run(cfg, rank)
    run.train_until(cfg.phase1_updates)
    if rank == 0:
        torch.save(run.state_dict(), cfg.ckpt)
    dist.barrier()
    del run  # "preemption"

    run = Run(cfg, rank)
    run.load_state_dict(torch.load(cfg.ckpt, weights_only=False))
    run.train_until(total)

    h = hashlib.sha256()
    for _, p in run.model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
