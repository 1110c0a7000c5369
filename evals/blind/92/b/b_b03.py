"""Tabular regression on 2 DDP ranks (gloo), a Trainer class split over methods.

Windows of K micro-batches never cross an epoch: each epoch has 10 micro-batches per rank,
so with K = 4 the last 2 of each epoch form an incomplete window that is not stepped on.
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def build_data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(160, 12, generator=g)
    w = torch.randn(12, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(160, 1, generator=g)
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        net = nn.Sequential(nn.Linear(12, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
        self.model = DDP(net, gradient_as_bucket_view=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        ds = build_data(args.seed)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=args.seed, drop_last=True)
        self.loader = DataLoader(ds, batch_size=args.batch_size, sampler=self.sampler)
        self.updates = 0

    def micro_step(self, x, y, sync):
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss = nn.functional.mse_loss(self.model(x), y) / self.args.accum
            loss.backward()
        return loss.detach()

    def apply_update(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        K = self.args.accum
        for i, (x, y) in enumerate(self.loader):
            boundary = (i + 1) % K == 0
            self.micro_step(x, y, sync=boundary)
            if boundary:
                self.apply_update()
        # the trailing len(loader) % K micro-batches are an incomplete window: no step for them

    def fit(self):
        for epoch in range(self.args.epochs):
            self.train_epoch(epoch)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse()
    dist.init_process_group("gloo")
    trainer = Trainer(args)
    trainer.fit()
    assert trainer.updates == args.epochs * (len(trainer.loader) // args.accum)
    if dist.get_rank() == 0:
        print("FINAL_SHA256", trainer.sha(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
