"""FSDP2 (fully_shard) trainer class for a small residual regressor.

Each block is its own FSDP unit, the root wraps the rest.  Inside a window the
gradient reduction is deferred; the trainer clears the optimizer's (sharded)
gradients at the start of every micro-step, which is fine while FSDP keeps the
window's unsharded gradients to itself until the last backward.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 3 * d)
        self.fc2 = nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.ln(x))))


class Regressor(nn.Module):
    def __init__(self, d, n_blocks):
        super().__init__()
        self.inp = nn.Linear(12, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_blocks)])
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


class ShardedTrainer:
    def __init__(self, args):
        self.args = args
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        model = Regressor(args.dim, args.blocks)
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(args.seed + 100 + self.rank)
        n = args.steps * args.grad_accum * args.micro_batch
        self.x = torch.randn(n, 12, generator=g)
        w = torch.randn(12, 3, generator=torch.Generator().manual_seed(5))
        self.y = torch.sin(self.x @ w) + 0.05 * torch.randn(n, 3, generator=g)

    def micro_batches(self, step):
        K, B = self.args.grad_accum, self.args.micro_batch
        base = step * K * B
        for k in range(K):
            sl = slice(base + k * B, base + (k + 1) * B)
            yield k, self.x[sl], self.y[sl]

    def set_sync(self, on: bool):
        # toggle the root and every nested unit
        self.model.set_requires_gradient_sync(on, recurse=True)

    def micro_step(self, k, x, y):
        K = self.args.grad_accum
        self.opt.zero_grad(set_to_none=True)
        self.set_sync(k == K - 1)
        pred = self.model(x)
        loss = nn.functional.mse_loss(pred, y) / K
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()

    def fit(self):
        for step in range(self.args.steps):
            total = torch.zeros(())
            for k, x, y in self.micro_batches(step):
                total += self.micro_step(k, x, y)
            self.optimizer_step()
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {total.item():.5f}")

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    tr = ShardedTrainer(parse())
    tr.fit()
    sha = tr.final_sha()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {sha}")
    dist.destroy_process_group()
