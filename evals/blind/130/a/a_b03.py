"""FSDP2 (fully_shard) trainer for a residual MLP regressor with a one-cycle schedule.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49021 a_b03.py
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--n-samples", type=int, default=256)
    p.add_argument("--in-dim", type=int, default=20)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8, help="per-rank micro-batch")
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.norm = nn.LayerNorm(w)
        self.fc1 = nn.Linear(w, 2 * w)
        self.fc2 = nn.Linear(2 * w, w)

    def forward(self, x):
        return x + self.fc2(F.silu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self, in_dim, width, depth):
        super().__init__()
        self.stem = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h).squeeze(-1)


def make_dataset(args):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.n_samples, args.in_dim, generator=g)
    w = torch.randn(args.in_dim, generator=g)
    y = torch.sin(x @ w / math.sqrt(args.in_dim)) * 2 + 0.1 * torch.randn(args.n_samples, generator=g)
    return TensorDataset(x, y)


class FSDPTrainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        model = ResMLP(args.in_dim, args.width, args.depth)
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        self.model = model

        ds = make_dataset(args)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=args.seed, drop_last=True)
        self.loader = DataLoader(ds, batch_size=args.batch_size, sampler=self.sampler, drop_last=True)

        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.max_lr, weight_decay=0.01)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer,
            max_lr=args.max_lr,
            epochs=args.epochs,
            steps_per_epoch=len(self.loader),
            pct_start=0.3,
        )
        self.micro_step = 0

    def _is_boundary(self):
        return (self.micro_step + 1) % self.args.grad_accum == 0

    def training_step(self, x, y):
        boundary = self._is_boundary()
        self.model.set_requires_gradient_sync(boundary)
        pred = self.model(x)
        loss = F.mse_loss(pred, y) / self.args.grad_accum
        loss.backward()
        if boundary:
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.micro_step += 1
        return loss.detach() * self.args.grad_accum

    def fit(self):
        for epoch in range(self.args.epochs):
            self.sampler.set_epoch(epoch)
            running = 0.0
            for x, y in self.loader:
                running += self.training_step(x, y).item()
            if self.rank == 0:
                print(f"epoch {epoch} mean loss {running / len(self.loader):.4f} "
                      f"lr {self.scheduler.get_last_lr()[0]:.2e}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    trainer = FSDPTrainer(get_args())
    trainer.fit()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
