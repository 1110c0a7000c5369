"""DDP multi-output regression trainer.

- rank 0 reads micro-batches of 3 rows, rank 1 micro-batches of 5 rows
- an epoch is 8 micro-batches per rank, K = 3: windows of 3, 3 and 2
- the loss is a row sum over the window's all-ranks row count (x W, since
  DDP averages), so a short window is still a mean over its own rows
- trunk on AdamW, head on SGD, one global clip over both, a worker DataLoader
"""
import hashlib
import itertools
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Hparams:
    d_in = 12
    d_out = 3
    hidden = 40
    k = 3
    micro_per_epoch = 8
    epochs = 2
    lr_trunk = 3e-3
    lr_head = 0.05
    clip = 1.0
    seed = 5


class RankShard(Dataset):
    def __init__(self, hp, rank):
        rows = 3 if rank == 0 else 5
        n = rows * hp.micro_per_epoch
        g = torch.Generator().manual_seed(hp.seed + 17 * rank)
        self.x = torch.randn(n, hp.d_in, generator=g)
        w = torch.linspace(-1.0, 1.0, hp.d_in * hp.d_out).view(hp.d_in, hp.d_out)
        self.y = torch.tanh(self.x @ w) * 3 + 0.05 * torch.randn(n, hp.d_out, generator=g)
        self.rows = rows

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(hp.d_in, hp.hidden), nn.SiLU(),
                                   nn.Linear(hp.hidden, hp.hidden), nn.SiLU())
        self.head = nn.Linear(hp.hidden, hp.d_out)

    def forward(self, x):
        return self.head(self.trunk(x))


class WindowedTrainer:
    def __init__(self, hp):
        self.hp = hp
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(hp.seed)
        net = Net(hp)
        self.ddp = DDP(net)
        self.opts = [
            torch.optim.AdamW(net.trunk.parameters(), lr=hp.lr_trunk),
            torch.optim.SGD(net.head.parameters(), lr=hp.lr_head, momentum=0.8),
        ]
        shard = RankShard(hp, self.rank)
        self.loader = DataLoader(shard, batch_size=shard.rows, shuffle=True, num_workers=1,
                                 generator=torch.Generator().manual_seed(hp.seed + self.rank),
                                 persistent_workers=False)
        self.clipped = 0

    def windows(self):
        it = iter(self.loader)
        while True:
            w = list(itertools.islice(it, self.hp.k))
            if not w:
                return
            yield w

    def all_ranks_rows(self, window):
        n = torch.tensor(float(sum(len(x) for x, _ in window)))
        dist.all_reduce(n)
        return n

    def step_window(self, window):
        n_all = self.all_ranks_rows(window)
        for i, (x, y) in enumerate(window):
            last = i == len(window) - 1
            with nullcontext() if last else self.ddp.no_sync():
                err = (self.ddp(x) - y).pow(2).sum()
                (err * self.world / n_all).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), self.hp.clip)
        self.clipped += int(norm > self.hp.clip)
        for o in self.opts:
            o.step()
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def fit(self):
        steps = 0
        for _ in range(self.hp.epochs):
            for window in self.windows():
                self.step_window(window)
                steps += 1
        if self.rank == 0:
            print(f"optimizer steps {steps}, clip acted {self.clipped}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    t = WindowedTrainer(Hparams())
    t.fit()
    d = t.digest()
    if t.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
