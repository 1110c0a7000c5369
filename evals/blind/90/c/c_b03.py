"""SimCLR-style contrastive pre-training on 2 DDP ranks (torchrun), hand-written loop.

Each micro-batch is its own NT-Xent problem (no cross-rank negatives), so the loss of a
window is the mean of its micro-batch losses. Warm-up + cosine learning rate by LambdaLR,
stepped once per optimizer step.
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup-frac", type=float, default=0.25)
    p.add_argument("--temperature", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class SimCLR(nn.Module):
    def __init__(self, d_in=24, d_hid=64, d_proj=16):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, d_hid), nn.ReLU(), nn.Linear(d_hid, d_hid), nn.ReLU())
        self.projector = nn.Sequential(nn.Linear(d_hid, d_hid), nn.ReLU(), nn.Linear(d_hid, d_proj))

    def forward(self, x):
        return F.normalize(self.projector(self.encoder(x)), dim=-1)


def augment(x, g):
    return x * (1 + 0.1 * torch.randn(x.shape, generator=g)) + 0.1 * torch.randn(x.shape, generator=g)


def nt_xent(z1, z2, tau):
    z = torch.cat([z1, z2], dim=0)
    n = z1.shape[0]
    sim = z @ z.t() / tau
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, target)


def warmup_cosine(total_steps, warmup_steps):
    def fn(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        prog = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))
    return fn


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    data = torch.randn(256, 24, generator=torch.Generator().manual_seed(args.seed))
    ds = TensorDataset(data)
    sampler = DistributedSampler(ds, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DDP(SimCLR())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    total_steps = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(total_steps, int(args.warmup_frac * total_steps))
    )
    aug_g = torch.Generator().manual_seed(args.seed + 1 + rank)

    opt_steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for it, (x,) in enumerate(loader):
            boundary = (it + 1) % args.accum == 0
            model.require_backward_grad_sync = boundary
            loss = nt_xent(model(augment(x, aug_g)), model(augment(x, aug_g)), args.temperature)
            (loss / args.accum).backward()
            if boundary:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                opt_steps += 1
        if rank == 0:
            print(f"epoch {epoch} steps {opt_steps} lr {sched.get_last_lr()[0]:.2e} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
