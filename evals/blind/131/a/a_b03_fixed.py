"""FSDP2 (fully_shard) trainer for a residual MLP regressor with a soft
orthogonality regulariser on the block projections.

Gradient sync is deferred inside each accumulation window and turned back on
for the window's last micro-batch.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--ortho", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=11)
    return ap.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return x + torch.tanh(self.proj(self.norm(x)))


class ResMLP(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)
        return self.out(h)


class FSDPTrainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        model = ResMLP(args.dim, args.depth)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        self.data_gen = torch.Generator().manual_seed(args.seed * 31 + self.rank)
        self.target = torch.randn(args.dim, 1, generator=torch.Generator().manual_seed(3))

    def next_batch(self):
        x = torch.randn(self.args.micro_batch, self.args.dim, generator=self.data_gen)
        y = torch.sin(x @ self.target)
        return x, y

    def orthogonality_penalty(self):
        total = 0.0
        for blk in self.model.blocks:
            w = blk.proj.weight
            if isinstance(w, DTensor):
                w = w.full_tensor()
            gram = w @ w.t()
            total = total + (gram - torch.eye(gram.size(0))).pow(2).sum()
        return self.args.ortho * total

    def task_loss(self, x, y):
        # averaged over the accumulation window
        return F.mse_loss(self.model(x), y) / self.args.accum

    def training_step(self, x, y):
        # the regulariser is evaluated on every micro-batch: weight it once per window
        return self.task_loss(x, y) + self.orthogonality_penalty() / self.args.accum

    def window(self):
        K = self.args.accum
        for k in range(K):
            self.model.set_requires_gradient_sync(k == K - 1)
            x, y = self.next_batch()
            self.training_step(x, y).backward()
        self.opt.step()
        self.opt.zero_grad()

    def fit(self):
        for _ in range(self.args.steps):
            self.window()


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = FSDPTrainer(parse_args())
    trainer.fit()
    sha = digest(trainer.model)
    if dist.get_rank() == 0:
        print("FINAL_SHA256", sha)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
