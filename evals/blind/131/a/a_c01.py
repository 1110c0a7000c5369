"""FSDP2 regressor on ragged per-rank micro-batches (rank 0: 3 rows, rank 1: 5
rows), windows of K = 3 micro-batches read ahead so the loss can be normalised by
the window's all-ranks row count, an epoch of 8 batches (3-3-2 windows) and a
frozen random-feature input layer.

Note: set_requires_all_reduce(False) only matters for HSDP; on this 1-D mesh
FSDP2 still reduce-scatters every micro-batch into the sharded gradients.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    dim: int = 24
    hidden: int = 48
    accum: int = 3
    batches_per_epoch: int = 8
    epochs: int = 2
    lr: float = 3e-3
    seed: int = 5


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.features = nn.Linear(c.dim, c.hidden)  # frozen random features
        self.body = nn.Sequential(nn.Linear(c.hidden, c.hidden), nn.SiLU(), nn.Linear(c.hidden, c.hidden), nn.SiLU())
        self.head = nn.Linear(c.hidden, 1)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.features(x))))


def rows_for(rank):
    return 3 if rank == 0 else 5


def epoch_batches(c, epoch, rank):
    g = torch.Generator().manual_seed(c.seed * 97 + epoch * 7 + rank)
    w = torch.randn(c.dim, 1, generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(c.batches_per_epoch):
        x = torch.randn(rows_for(rank), c.dim, generator=g)
        out.append((x, torch.cos(x @ w) + 0.1 * x[:, :1]))
    return out


class Trainer:
    def __init__(self, c):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        net = Net(c)
        net.features.requires_grad_(False)
        mesh = init_device_mesh("cpu", (self.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        fully_shard(net.body, mesh=mesh, mp_policy=mp)
        fully_shard(net, mesh=mesh, mp_policy=mp)
        self.net = net
        self.opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=c.lr, weight_decay=0.01)

    def windows(self, batches):
        for s in range(0, len(batches), self.c.accum):
            yield batches[s:s + self.c.accum]

    def step_window(self, window):
        n = torch.tensor(float(sum(x.size(0) for x, _ in window)))
        dist.all_reduce(n)
        for i, (x, y) in enumerate(window):
            self.net.set_requires_all_reduce(i == len(window) - 1)
            sq = (self.net(x) - y).pow(2).sum()
            (sq * self.world / n).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.c.epochs):
            for window in self.windows(epoch_batches(self.c, epoch, self.rank)):
                self.step_window(window)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    t = Trainer(Cfg())
    t.fit()
    h = hashlib.sha256()
    for _, p in t.net.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if dist.get_rank() == 0:
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
