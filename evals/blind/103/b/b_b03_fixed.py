"""Two-tower retrieval-style scorer on DDP with a sharded optimizer state
(ZeroRedundancyOptimizer) and K-step accumulation under DDP.no_sync().
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


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bsz", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=2024)
    return ap.parse_args()


class TwoTower(nn.Module):
    def __init__(self, d_in=24, d=32):
        super().__init__()
        self.q = nn.Sequential(nn.Linear(d_in, d), nn.Tanh(), nn.Linear(d, d))
        self.k = nn.Sequential(nn.Linear(d_in, d), nn.Tanh(), nn.Linear(d, d))
        self.temp = nn.Parameter(torch.tensor(2.0))

    def forward(self, a, b):
        qa = F.normalize(self.q(a), dim=-1)
        kb = F.normalize(self.k(b), dim=-1)
        return self.temp * qa @ kb.t()


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def batches(rank, world, n, bsz, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(world, n, bsz, 24, generator=g)
    b = a + 0.3 * torch.randn(world, n, bsz, 24, generator=g)
    return a[rank], b[rank]


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    model = DDP(TwoTower())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=args.lr, weight_decay=0.0)

    n_micro = args.steps * args.accum
    A, B = batches(rank, world, n_micro, args.bsz, args.seed + 1)
    target = torch.arange(args.bsz)

    for step in range(args.steps):
        for k in range(args.accum):
            with contextlib.ExitStack() as stack:
                if k < args.accum - 1:
                    # defer the all-reduce until the last micro-batch of the window
                    stack.enter_context(model.no_sync())
                i = step * args.accum + k
                logits = model(A[i], B[i])
                loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))
                (loss / args.accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sha = params_sha(model.module)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
