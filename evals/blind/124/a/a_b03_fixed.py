"""FSDP2 (fully_shard) trainer: fixed-size accumulation windows, the epoch's
incomplete tail window is discarded (like drop_last for the large batch)."""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Net(nn.Module):
    def __init__(self, d_in, d, n_blocks, n_out):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_blocks)])
        self.out = nn.Linear(d, n_out)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


class FSDPTrainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (self.world,))
        torch.manual_seed(args.seed)
        self.model = Net(args.d_in, args.dim, args.blocks, args.n_out)
        for blk in self.model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, betas=(0.9, 0.95))
        self.steps = 0

    def make_loader(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed + 1)
        x = torch.randn(a.rows, a.d_in, generator=g)
        y = torch.randint(0, a.n_out, (a.rows,), generator=g)
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=True, seed=a.seed)
        return DataLoader(ds, batch_size=a.micro_bs, sampler=self.sampler)

    def micro_step(self, batch, sync):
        x, y = batch
        self.model.set_requires_gradient_sync(sync)
        loss = F.cross_entropy(self.model(x), y)
        (loss / self.args.grad_accum).backward()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1

    def run_epoch(self, loader, epoch):
        K = self.args.grad_accum
        self.sampler.set_epoch(epoch)
        n = len(loader)
        full = n - n % K
        for i, batch in enumerate(loader):
            if i >= full:
                break  # incomplete window at the end of the epoch: skip it
            boundary = (i + 1) % K == 0
            self.micro_step(batch, sync=boundary)
            if boundary:
                self.optimizer_step()

    def fit(self):
        loader = self.make_loader()
        for epoch in range(self.args.epochs):
            self.run_epoch(loader, epoch)

    def final_params(self):
        out = []
        for n, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            out.append((n, t.detach().float().contiguous()))
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d-in", type=int, default=20)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--n-out", type=int, default=5)
    p.add_argument("--rows", type=int, default=2 * 4 * 26)  # 26 micro-batches per rank and epoch
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer = FSDPTrainer(args)
    trainer.fit()
    final = trainer.final_params()
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
