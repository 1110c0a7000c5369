"""Regression MLP sharded with FSDP2 (fully_shard), accumulating K micro-batches per step.

Gradient sync is switched off on the micro-batches that do not close a window, so each
window pays one reduce-scatter. An epoch does not divide into windows: its last window is
short and is normalised by its own length.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

SEED = 7
DIM = 32
MICRO_BS = 6
ACCUM = 4
EPOCH_MICRO = 10   # micro-batches per rank per epoch: windows of 4, 4, 2
EPOCHS = 2
LR = 3e-3


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList([Block(DIM) for _ in range(3)])
        self.out = nn.Linear(DIM, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).squeeze(-1)


def shard_data(rank):
    g = torch.Generator().manual_seed(SEED * 100 + rank)
    xs = torch.randn(EPOCH_MICRO, MICRO_BS, DIM, generator=g)
    w = torch.linspace(-1, 1, DIM)
    ys = torch.sin(xs @ w) + 0.1 * torch.randn(EPOCH_MICRO, MICRO_BS, generator=g)
    return list(zip(xs, ys))


class Trainer:
    def __init__(self, model, optim):
        self.model = model
        self.optim = optim

    def train_epoch(self, epoch, batches):
        n_total = len(batches)
        for i, (x, y) in enumerate(batches):
            win_start = (i // ACCUM) * ACCUM
            win_len = min(ACCUM, n_total - win_start)
            closes_window = (i + 1) % ACCUM == 0
            self.model.set_requires_gradient_sync(closes_window)
            pred = self.model(x)
            loss = nn.functional.mse_loss(pred, y) / win_len
            loss.backward()
            if closes_window or i + 1 == n_total:
                self.optim.step()
                self.optim.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = Net()
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    trainer = Trainer(model, optim)
    data = shard_data(rank)
    for epoch in range(EPOCHS):
        trainer.train_epoch(epoch, data)

    flat = []
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        flat.append(t.detach().float().reshape(-1))
    flat = torch.cat(flat)
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
