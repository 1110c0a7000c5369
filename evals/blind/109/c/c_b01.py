"""Keyword spotting on 2 DDP ranks: a small conv net with BatchNorm over log-mel
patches, a worker DataLoader, gradient accumulation with no_sync and a timm-style
per-update cosine schedule with warm-up."""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

ACCUM = 3
EPOCHS = 3
MICRO_BS = 8
N_CLASSES = 10
BASE_LR = 3e-3


class SyntheticMels(Dataset):
    def __init__(self, n=192, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, N_CLASSES, (n,), generator=g)
        proto = torch.randn(N_CLASSES, 1, 16, 20, generator=g)
        self.x = proto[self.y] + 0.8 * torch.randn(n, 1, 16, 20, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        # a little SpecAugment-like time masking, deterministic per index
        x = self.x[i].clone()
        t0 = (i * 7) % 16
        x[..., t0:t0 + 3] = 0.0
        return x, self.y[i]


class KWSNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, N_CLASSES)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class CosineLRScheduler:
    """Minimal version of timm's CosineLRScheduler (per-update stepping)."""

    def __init__(self, optimizer, t_initial, lr_min=1e-5, warmup_t=0, warmup_lr_init=1e-5):
        self.optimizer = optimizer
        self.t_initial = t_initial
        self.lr_min = lr_min
        self.warmup_t = warmup_t
        self.warmup_lr_init = warmup_lr_init
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.step_update(0)

    def _get_lr(self, t):
        out = []
        for base in self.base_lrs:
            if t < self.warmup_t:
                out.append(self.warmup_lr_init + t * (base - self.warmup_lr_init) / self.warmup_t)
            else:
                tt = min(t - self.warmup_t, self.t_initial - self.warmup_t)
                frac = tt / max(1, self.t_initial - self.warmup_t)
                out.append(self.lr_min + 0.5 * (base - self.lr_min) * (1 + math.cos(math.pi * frac)))
        return out

    def step_update(self, num_updates):
        for g, lr in zip(self.optimizer.param_groups, self._get_lr(num_updates)):
            g["lr"] = lr


def train_one_epoch(epoch, model, loader, optimizer, lr_scheduler, num_updates):
    model.train()
    last_idx = len(loader) - 1
    updates_per_epoch = (len(loader) + ACCUM - 1) // ACCUM
    last_accum_steps = len(loader) % ACCUM
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    for batch_idx, (x, y) in enumerate(loader):
        last_batch = batch_idx == last_idx
        need_update = last_batch or (batch_idx + 1) % ACCUM == 0
        accum_steps = ACCUM
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps
        ctx = model.no_sync() if not need_update else nullcontext()
        with ctx:
            loss = F.cross_entropy(model(x), y)
            (loss / accum_steps).backward()
        num_updates += 1
        if not need_update:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lr_scheduler.step_update(num_updates=num_updates)
    return num_updates, updates_per_epoch


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)

    ds = SyntheticMels()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, num_workers=2,
                        persistent_workers=True)

    model = DDP(KWSNet())
    optimizer = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=0.01)
    updates_per_epoch = (len(loader) + ACCUM - 1) // ACCUM
    lr_scheduler = CosineLRScheduler(optimizer, t_initial=EPOCHS * updates_per_epoch,
                                     warmup_t=2, warmup_lr_init=1e-4)

    num_updates = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        num_updates, _ = train_one_epoch(epoch, model, loader, optimizer, lr_scheduler, num_updates)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
