"""Tiny CNN on synthetic 'images', DDP on 2 CPU ranks, OneCycle schedule.

nanoGPT-ish loop: gradient accumulation with DDP.no_sync() on every micro-step but the
last of a window, one scheduler step per optimizer step.
"""
import argparse
import contextlib
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-samples", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-lr", type=float, default=2e-2)
    ap.add_argument("--seed", type=int, default=2024)
    return ap.parse_args()


class SmallCNN(nn.Module):
    def __init__(self, n_classes=6):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16 * 6 * 6, n_classes)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(x.flatten(1))


def build_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 12, 12, generator=g)
    y = (x[:, 0, :6, :6].sum((1, 2)) > 0).long() + 2 * (x[:, 0, 6:, 6:].mean((1, 2)) > 0).long()
    return TensorDataset(x, y)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    train_set = build_dataset(args.n_samples, args.seed)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DDP(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.max_lr, momentum=0.9, nesterov=True)
    steps_per_epoch = math.ceil(len(train_set) / (args.batch_size * args.grad_accum))
    total_steps = args.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.max_lr, total_steps=total_steps, pct_start=0.3, anneal_strategy="cos"
    )

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for it, (x, y) in enumerate(loader):
            sync_now = (it + 1) % args.grad_accum == 0
            ctx = contextlib.nullcontext() if sync_now else model.no_sync()
            with ctx:
                loss = F.cross_entropy(model(x), y) / args.grad_accum
                loss.backward()
            if sync_now:
                lr_used = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                if rank == 0:
                    print(f"step {step} lr {lr_used:.5f} loss {loss.item() * args.grad_accum:.4f}", flush=True)

    sha = final_sha(p for _, p in model.module.named_parameters())
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def final_sha(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    main()
