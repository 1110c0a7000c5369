"""FSDP2 (fully_shard per block + root) on variable-size micro-batches.

Each optimizer step averages the per-sample loss over every sample of the window on all
ranks. The epoch has 10 micro-batches per rank and K = 4, so each epoch ends in a short
window of 2 micro-batches, normalised by its own (smaller) sample count. Gradients are
clipped on the sharded DTensor gradients before the step.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


@dataclass(frozen=True)
class Cfg:
    dim: int = 20
    width: int = 40
    depth: int = 3
    accum: int = 4
    micro_per_epoch: int = 10
    epochs: int = 2
    lr: float = 5e-3
    clip: float = 0.3
    seed: int = 555


class ResMLP(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.inp = nn.Linear(c.dim, c.width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(c.width), nn.Linear(c.width, c.width), nn.SiLU())
            for _ in range(c.depth))
        self.out = nn.Linear(c.width, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


class EpochData:
    """Per rank, per epoch: micro-batches of 3..9 samples (different on every rank)."""

    def __init__(self, c: Cfg, rank: int):
        self.c, self.rank = c, rank

    def epoch(self, e):
        g = torch.Generator().manual_seed(self.c.seed + 100 * e + self.rank)
        for _ in range(self.c.micro_per_epoch):
            n = int(torch.randint(3, 10, (1,), generator=g))
            x = torch.randn(n, self.c.dim, generator=g)
            y = torch.randint(0, 3, (n,), generator=g)
            yield x, y


def windows(it, k):
    buf = []
    for item in it:
        buf.append(item)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c.seed)
    model = ResMLP(c)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    crit = nn.CrossEntropyLoss(reduction="sum")
    data = EpochData(c, rank)

    steps = 0
    for e in range(c.epochs):
        for win in windows(data.epoch(e), c.accum):
            n_global = torch.tensor(float(sum(len(y) for _, y in win)))
            dist.all_reduce(n_global, op=dist.ReduceOp.SUM)
            for j, (x, y) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                loss = crit(model(x), y) * world / n_global
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
            opt.step()
            opt.zero_grad()
            steps += 1
    assert steps == c.epochs * 3

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
