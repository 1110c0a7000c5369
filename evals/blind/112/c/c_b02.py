"""Memory-lean trainer: bf16 model weights, fp32 master copy in the optimizer, hand-written
data parallelism (one all-reduce per window), activation checkpointing on the blocks."""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--n-blocks", type=int, default=3)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--port", type=int, default=49203)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Regressor(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.out = nn.Linear(d, 4)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=False)
        return self.out(h)


class MasterWeightTrainer:
    """Keeps the module in bf16 and an fp32 master copy that the optimizer owns."""

    def __init__(self, model, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        self.model = model.to(torch.bfloat16)
        self.masters = [p.detach().clone().float().requires_grad_(True) for p in self.model.parameters()]
        self.opt = torch.optim.SGD(self.masters, lr=args.lr, momentum=0.9)

    def _harvest(self):
        # move the bf16 gradients into the fp32 master gradients
        for p, m in zip(self.model.parameters(), self.masters):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = torch.zeros_like(m)
            m.grad.add_(p.grad.float())
            p.grad = None

    def _sync_and_step(self):
        flat = torch.cat([m.grad.reshape(-1) for m in self.masters])
        dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for m in self.masters:
            n = m.numel()
            m.grad.copy_(flat[off:off + n].view_as(m))
            off += n
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.model.parameters(), self.masters):
                p.copy_(m.to(torch.bfloat16))

    def data(self, step, micro):
        g = torch.Generator().manual_seed(7919 * step + 31 * micro + 5 * self.rank)
        x = torch.randn(self.args.micro_batch, 16, generator=g)
        y = torch.stack([x[:, :4].sum(1), x[:, 4:8].prod(1), x[:, 8:12].abs().mean(1), x[:, 12:].max(1).values], 1)
        return x.to(torch.bfloat16), y

    def train(self):
        K = self.args.accum
        for step in range(self.args.steps):
            for micro in range(K):
                x, y = self.data(step, micro)
                pred = self.model(x).float()
                loss = F.mse_loss(pred, y) / K
                loss.backward()
            self._harvest()
            self._sync_and_step()


def sha_of(trainer):
    h = hashlib.sha256()
    for (name, _), m in zip(trainer.model.named_parameters(), trainer.masters):
        h.update(m.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(rank, world, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    tr = MasterWeightTrainer(Regressor(args.dim, args.n_blocks), args, rank, world)
    tr.train()
    if rank == 0:
        print("FINAL_SHA256", sha_of(tr), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = get_args()
    mp.spawn(run, args=(2, a), nprocs=2, join=True)
