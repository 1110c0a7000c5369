"""SimCLR-style contrastive pre-training on spawned ranks, hand-written gradient sync.

The stem is frozen for a short linear-probe warm-up and then unfrozen.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Cfg:
    world_size: int = 2
    port: int = 45212
    grad_accum: int = 3
    micro_bs: int = 8
    max_steps: int = 16
    unfreeze_stem_at: int = 6
    lr: float = 3e-3
    weight_decay: float = 0.05
    temperature: float = 0.2
    dim_in: int = 24
    seed: int = 1234


class Encoder(nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(d_in, 64), nn.GELU())
        self.body = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
        self.proj = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x):
        return self.proj(self.body(self.stem(x)))


class GradSync:
    """All-reduce (average) the gradients of the trainable parameters."""

    def __init__(self, model, world_size):
        self.model = model
        self.world_size = world_size

    @torch.no_grad()
    def __call__(self):
        for p in self.model.parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(self.world_size)


def augment(x, g):
    noise = 0.15 * torch.randn(x.shape, generator=g)
    scale = 1.0 + 0.1 * torch.randn(x.shape[0], 1, generator=g)
    return x * scale + noise


def info_nce(z1, z2, t):
    z1 = F.normalize(z1, dim=-1)
    z2 = F.normalize(z2, dim=-1)
    logits = z1 @ z2.t() / t
    labels = torch.arange(z1.shape[0])
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


def sample_batch(cfg, rank, step, micro):
    g = torch.Generator().manual_seed(cfg.seed + 100003 * rank + 1009 * step + micro)
    centers = torch.randn(cfg.micro_bs, cfg.dim_in, generator=g)
    return augment(centers, g), augment(centers, g)


def worker(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = Encoder(cfg.dim_in)
    for p in model.stem.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sync = GradSync(model, cfg.world_size)

    for step in range(cfg.max_steps):
        if step == cfg.unfreeze_stem_at:
            for p in model.stem.parameters():
                p.requires_grad_(True)
            if rank == 0:
                print(f"step {step}: stem unfrozen", flush=True)
        for micro in range(cfg.grad_accum):
            v1, v2 = sample_batch(cfg, rank, step, micro)
            loss = info_nce(model(v1), model(v2), cfg.temperature) / cfg.grad_accum
            loss.backward()
        sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * cfg.grad_accum:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    cfg = Cfg()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
