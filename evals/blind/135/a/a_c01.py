"""FSDP2 trainer: ranks hold different numbers of rows per micro-batch (3 and 5), epochs of 8
micro-batches with K = 3 give 3-3-2 windows; each window is normalised by its all-ranks row
count (x W because FSDP2 averages); gradient sync only on a window's last micro-batch; clip 0.5."""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh


class Cfg:
    accum = 3
    micro_per_epoch = 8
    epochs = 2
    rows_by_rank = (3, 5)
    d = 24
    lr = 1e-2
    clip = 0.5
    seed = 99


class Net(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.SiLU()) for _ in range(2)])
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.out(x).squeeze(-1)


class FSDPTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (self.world,))
        torch.manual_seed(cfg.seed)
        self.model = Net(cfg.d)
        for blk in self.model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        g = torch.Generator().manual_seed(cfg.seed + 1)
        rows = sum(cfg.rows_by_rank)
        n = rows * cfg.micro_per_epoch * cfg.epochs
        self.x = torch.randn(n, cfg.d, generator=g)
        self.y = self.x[:, :3].sum(-1) * 2 + 0.5

    def batch(self, epoch, i):
        rows = sum(self.cfg.rows_by_rank)
        base = (epoch * self.cfg.micro_per_epoch + i) * rows + sum(self.cfg.rows_by_rank[:self.rank])
        r = self.cfg.rows_by_rank[self.rank]
        return self.x[base:base + r], self.y[base:base + r]

    def epoch_windows(self):
        k, m = self.cfg.accum, self.cfg.micro_per_epoch
        return [list(range(s, min(s + k, m))) for s in range(0, m, k)]

    def window_count(self, window):
        n = torch.tensor(float(len(window) * self.cfg.rows_by_rank[self.rank]))
        dist.all_reduce(n)
        return n

    def train_epoch(self, epoch):
        for window in self.epoch_windows():
            denom = self.window_count(window)
            for j, i in enumerate(window):
                last = j == len(window) - 1
                self.model.set_requires_gradient_sync(last)
                xb, yb = self.batch(epoch, i)
                loss = F.mse_loss(self.model(xb), yb, reduction="sum") * self.world / denom
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
            self.opt.step()
            self.opt.zero_grad()
            if self.rank == 0:
                print(f"epoch {epoch} window {window} grad-norm {norm.full_tensor().item():.3f}",
                      flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    tr = FSDPTrainer(Cfg())
    for e in range(Cfg.epochs):
        tr.train_epoch(e)
    d = tr.digest()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
