"""DDP + ZeroRedundancyOptimizer ranking model, worker DataLoader, no_sync windows with a
short epoch tail, and the old hand-written gradient average kept from the pre-DDP code.

Launch: torchrun --nproc-per-node 2 ... b_c03.py
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class PairSet(Dataset):
    """Query/document feature pairs with a relevance grade."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.randn(n, 10, generator=g)
        self.d = torch.randn(n, 10, generator=g)
        self.grade = ((self.q * self.d).sum(1) > 0).float()

    def __len__(self):
        return len(self.q)

    def __getitem__(self, i):
        return self.q[i], self.d[i], self.grade[i]


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.bilinear = nn.Bilinear(16, 16, 1)

    def forward(self, q, d):
        return self.bilinear(self.tower(q), self.tower(d)).squeeze(-1)


def average_gradients(model):
    # kept from the pre-DDP launcher: make sure every rank holds the mean gradient
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(world)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--bs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=77)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DDP(Scorer())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-3, weight_decay=0.02)

    data = PairSet(10 * args.bs * world, args.seed + 1)        # 10 micro-batches per rank per epoch
    shard = torch.utils.data.Subset(data, list(range(rank, len(data), world)))

    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed + 1000 + epoch)
        loader = DataLoader(shard, batch_size=args.bs, shuffle=True, generator=g,
                            num_workers=1, persistent_workers=False)
        n = len(loader)
        for i, (q, d, grade) in enumerate(loader):
            win_start = (i // args.accum) * args.accum
            win_len = min(args.accum, n - win_start)          # 4, 4, then a tail of 2
            boundary = (i + 1) % args.accum == 0 or i + 1 == n
            ctx = contextlib.nullcontext() if boundary else model.no_sync()
            with ctx:
                loss = F.binary_cross_entropy_with_logits(model(q, d), grade) / win_len
                loss.backward()
            if boundary:
                average_gradients(model)
                opt.step()
                opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
