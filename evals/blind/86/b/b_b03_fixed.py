"""DDP classifier over unevenly sharded data, using the Join context manager.

The ranks hold different numbers of micro-batches (the shards are split by source
file, not padded). Join lets the rank that runs out early shadow the collectives of the
ranks still training. Each optimizer step is the per-sample mean over every sample of the
window, on whichever ranks still have data.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


def load_shard(rank, micro_bs, seed):
    # rank 0's files hold 48 samples, rank 1's 32
    n = 48 if rank == 0 else 32
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long() + (x[:, 5] > 0.5).long()
    return [(x[i:i + micro_bs], y[i:i + micro_bs]) for i in range(0, n, micro_bs)]


def build_model():
    return nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 3))


def train(ddp, opt, batches, accum):
    with Join([ddp], divide_by_initial_world_size=False):
        for i, (x, y) in enumerate(batches):
            boundary = (i + 1) % accum == 0
            ctx = contextlib.nullcontext() if boundary else ddp.no_sync()
            with ctx:
                loss = F.cross_entropy(ddp(x), y) / accum
                loss.backward()
            if boundary:
                opt.step()
                opt.zero_grad(set_to_none=True)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = build_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    batches = load_shard(rank, args.micro_bs, args.seed)
    train(ddp, opt, batches, args.accum)

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in ddp.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
