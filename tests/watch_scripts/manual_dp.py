"""Data parallelism written by hand (no DDP): each rank accumulates K micro-batches, then
all-reduces ``.grad`` itself. ``--bug sum`` sums the ranks' gradients and never divides by
the world size (every update W x too large, F10); the default divides by it (correct).
Used by the multi-node test: only a report that holds every rank can tell them apart."""

import argparse

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--bug", default="none")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
accumulation_steps = 4
data = [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g))
        for _ in range(4 * accumulation_steps)]

for i, (x, y) in enumerate(data):
    loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation_steps
    loss.backward()
    if (i + 1) % accumulation_steps == 0:
        for prm in model.parameters():
            dist.all_reduce(prm.grad, op=dist.ReduceOp.SUM)
            if args.bug != "sum":
                prm.grad /= world
        opt.step()
        opt.zero_grad(set_to_none=True)
# both ranks done with their last all-reduce before either tears gloo down (a rank that
# exits while its peer's pair is still open can abort in gloo's teardown)
dist.barrier()
dist.destroy_process_group()
print("trained")
