"""FSDP2 regression on spawned ranks with ragged micro-batches.

Each epoch every rank walks 7 micro-batches of different sizes with K = 3, so the epoch ends
in a one-micro-batch window. The loss of a window is the squared-error sum over the window's
samples on all ranks, divided by that all-ranks count (times W, undoing FSDP2's average).
A frozen input scale lives in the root unit; the blocks are their own FSDP units.

Launch: python b_c02.py
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

WORLD, PORT = 2, 46108
K, EPOCHS, LR, CLIP, SEED = 3, 2, 1e-2, 0.8, 31
SIZES = {0: [3, 5, 4, 2, 6, 3, 4], 1: [5, 2, 4, 6, 3, 3, 5]}


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, h):
        return h + torch.relu(self.lin(self.norm(h)))


class Regressor(nn.Module):
    def __init__(self, d_in=8, d=16):
        super().__init__()
        self.in_scale = nn.Parameter(torch.linspace(0.5, 1.5, d_in), requires_grad=False)
        self.proj = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(Block(d), Block(d), Block(d))
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        return self.out(self.blocks(self.proj(x * self.in_scale)))


def epoch_data(rank, epoch):
    g = torch.Generator().manual_seed(SEED * 100 + epoch * 10 + rank)
    out = []
    for n in SIZES[rank]:
        x = torch.randn(n, 8, generator=g)
        y = torch.stack([x[:, :4].sum(1), (x[:, 4:] ** 2).mean(1)], 1)
        out.append((x, y))
    return out


def split_windows(batches, k):
    return [batches[i:i + k] for i in range(0, len(batches), k)]


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(SEED)
    model = Regressor()
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=LR)

    for epoch in range(EPOCHS):
        for window in split_windows(epoch_data(rank, epoch), K):
            count = torch.tensor(float(sum(len(x) for x, _ in window)))
            dist.all_reduce(count)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                sse = ((model(x) - y) ** 2).sum()
                (sse * WORLD / count).backward()
            torch.nn.utils.clip_grad_norm_(trainable, CLIP)
            opt.step()
            opt.zero_grad()

    full = [(n, p.full_tensor().detach()) for n, p in model.named_parameters()]
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(dict(full), os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, t in full:
            h.update(t.float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
