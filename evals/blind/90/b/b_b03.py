# DDP with gradient_as_bucket_view and a custom fp32 communication hook
# (buckets are upcast for the all-reduce and cast back).  Accumulation uses
# no_sync() for the first K-1 micro-batches of each window.
import argparse
import contextlib
import hashlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fp32_mean_hook(state, bucket):
    """All-reduce a gradient bucket in fp32 and return the mean over ranks."""
    group = state if state is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    t = buf.to(torch.float32).div_(world)
    fut = dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()

    def _back(f):
        out = f.value()[0]
        buf.copy_(out)
        return buf

    return fut.then(_back)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--micro-bs", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def build_model():
    return nn.Sequential(
        nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 6, 48), nn.ReLU(), nn.Linear(48, 3)
    )


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = build_model()
    model = DDP(net, gradient_as_bucket_view=True)
    model.register_comm_hook(dist.group.WORLD, fp32_mean_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    g = torch.Generator().manual_seed(99)
    n = args.steps * args.accum * args.micro_bs * world
    X = torch.randint(0, 50, (n, 6), generator=g)
    Y = (X.sum(1) % 3)
    X, Y = X[rank::world], Y[rank::world]

    it = 0
    for step in range(args.steps):
        for k in range(args.accum):
            xb = X[it * args.micro_bs:(it + 1) * args.micro_bs]
            yb = Y[it * args.micro_bs:(it + 1) * args.micro_bs]
            it += 1
            ctx = model.no_sync() if k < args.accum - 1 else contextlib.nullcontext()
            with ctx:
                loss = nn.functional.cross_entropy(model(xb), yb) / args.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
