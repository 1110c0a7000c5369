"""A plain DDP accumulation loop (torchrun style). ``--bug`` injects one known mistake."""

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import clip_grad_norm_

p = argparse.ArgumentParser()
p.add_argument("--bug", default="none")
p.add_argument("--k", type=int, default=4)
p.add_argument("--batches", type=int, default=16)
p.add_argument("--epochs", type=int, default=1)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
g = torch.Generator().manual_seed(100 + rank)
data = [(torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g))
        for _ in range(args.batches)]
K = args.k

for _epoch in range(args.epochs):
    for i, (x, y) in enumerate(data):
        last = (i + 1) % K == 0 or i + 1 == len(data)
        if args.bug == "F3":
            model.zero_grad()  # every micro-step: only the last micro-batch survives
        if args.bug == "F13":
            last = (i + 1) % (K + 1) == 0
        if args.bug == "F11":
            out = model(x)
            model.require_backward_grad_sync = last  # set after the forward: too late
            loss = torch.nn.functional.cross_entropy(out, y) / K
            loss.backward()
        elif args.bug == "wasteful":
            loss = torch.nn.functional.cross_entropy(model(x), y) / K
            with contextlib.nullcontext() if last else model.no_sync():  # backward only
                loss.backward()
        else:
            with contextlib.nullcontext() if last else model.no_sync():
                loss = torch.nn.functional.cross_entropy(model(x), y) / K
                loss.backward()
        if args.bug == "F8":
            clip_grad_norm_(model.parameters(), 0.5)
        if args.bug == "F4":
            sched.step()
        if last or args.bug == "F1":
            if args.bug != "F8":
                clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            if args.bug != "F4":
                sched.step()
            if args.bug != "F7":
                opt.zero_grad(set_to_none=True)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print("trained")
