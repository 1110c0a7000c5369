"""Sequence regressor sharded with FSDP2 (fully_shard), trained by a small trainer class.

Gradients are reduce-scattered on every micro-step (no deferred sync) and the sharded
gradients accumulate in .grad until the boundary. A helper keeps peak memory down.
"""
import argparse
import gc
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--micro-bs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Regressor(nn.Module):
    def __init__(self, d_in=16, d=32, depth=3):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).squeeze(-1)


class ShardedTrainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        model = Regressor()
        mesh = init_device_mesh("cpu", (self.world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(args.seed + 100 + self.rank)
        self.w_true = torch.randn(16, generator=torch.Generator().manual_seed(args.seed + 1))

    def next_batch(self):
        x = torch.randn(self.args.micro_bs, 16, generator=self.gen)
        y = torch.tanh(x @ self.w_true) + 0.1 * torch.randn(self.args.micro_bs, generator=self.gen)
        return x, y

    def _release_memory(self):
        # drop stale gradient storage and collect before the next forward
        self.opt.zero_grad(set_to_none=True)
        gc.collect()

    def forward_backward(self, x, y):
        self._release_memory()
        pred = self.model(x)
        loss = nn.functional.mse_loss(pred, y) / self.args.accum
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        for step in range(self.args.steps):
            total = torch.zeros(())
            for _ in range(self.args.accum):
                x, y = self.next_batch()
                total += self.forward_backward(x, y)
            self.optimizer_step()
            if self.rank == 0 and step % 3 == 0:
                print(f"step {step} loss {total.item():.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = ShardedTrainer(args)
    trainer.train()
    d = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
