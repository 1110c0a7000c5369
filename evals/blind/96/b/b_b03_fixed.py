"""Image-patch classifier on DDP, launched with mp.spawn (`python b_b03.py`).

The Trainer groups micro-batches into windows and accumulates locally, letting
DDP all-reduce once per window.
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49132
WORLD = 2


class PatchNet(nn.Module):
    def __init__(self, n_cls=5):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8 * 4 * 4, 32)
        self.cls = nn.Linear(32, n_cls)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.norm(self.conv(x))), 2)
        return self.cls(F.relu(self.fc(h.flatten(1))))


class Trainer:
    def __init__(self, rank, accum=2, micro_bs=6, updates=15, lr=0.05):
        self.rank, self.accum, self.micro_bs, self.updates = rank, accum, micro_bs, updates
        torch.manual_seed(7)
        self.model = DDP(PatchNet())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9, nesterov=True)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        self.proto = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(3))

    def next_window(self):
        out = []
        for _ in range(self.accum):
            y = torch.randint(0, 5, (self.micro_bs,), generator=self.gen)
            x = self.proto[y] + 0.8 * torch.randn(self.micro_bs, 3, 8, 8, generator=self.gen)
            out.append((x, y))
        return out

    def compute_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def accumulate(self, window):
        # local accumulation; DDP reduces on the window's last backward
        for i, batch in enumerate(window):
            sync = i == len(window) - 1
            with contextlib.nullcontext() if sync else self.model.no_sync():
                loss = self.compute_loss(batch) / len(window)
                loss.backward()
        return loss.detach() * len(window)

    def fit(self):
        for step in range(self.updates):
            loss = self.accumulate(self.next_window())
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def worker(rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    tr = Trainer(rank)
    tr.fit()
    sha = tr.sha()
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
