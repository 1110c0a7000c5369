"""Tabular classifier on DDP with ZeroRedundancyOptimizer (AdamW states sharded over the
2 ranks). Accumulation K = 4 over a DataLoader whose last micro-batch is short (windows
4-4-2 per epoch); the non-final micro-batches run their forward under ddp.no_sync(), and
the backward happens after the context has closed. The loss is a sum over the window's
sample count on all ranks, times the world size. A frozen stem, a clip at 1.0."""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUM = 4
BATCH = 8
EPOCHS = 3
N = 148  # 74 per rank: 9 full micro-batches + one of 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(20, 32)
        self.stem.requires_grad_(False)  # frozen random projection
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.body(self.stem(x))


def group_windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(2024)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(N, 20, generator=g)
    Y = (X[:, :3] + 0.3 * torch.randn(N, 3, generator=g)).argmax(1)
    ds = TensorDataset(X, Y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=11, drop_last=False)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)

    ddp = DDP(Net())
    opt = ZeroRedundancyOptimizer(
        [p for p in ddp.parameters() if p.requires_grad], optimizer_class=torch.optim.AdamW, lr=5e-3, weight_decay=0.01
    )

    steps = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for window in group_windows(loader, ACCUM):
            n_win = torch.tensor(float(sum(len(y) for _, y in window)))
            dist.all_reduce(n_win)
            for j, (x, y) in enumerate(window):
                final = j == len(window) - 1
                with (contextlib.nullcontext() if final else ddp.no_sync()):
                    logits = ddp(x)
                loss = F.cross_entropy(logits, y, reduction="sum") * world / n_win
                loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1

    h = hashlib.sha256()
    for _, p in ddp.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"steps {steps}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
