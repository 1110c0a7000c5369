"""DDP with a custom fp32 all-reduce comm hook and ZeroRedundancyOptimizer (SGD + momentum).

The hook does the averaging itself so the reduction always runs in fp32 and
uses a pre-divide (keeps the summed values small).  Gradients are accumulated
locally under no_sync and reduced once per window.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

GRAD_ACCUM = 3
MICRO_BATCH = 6
OPT_STEPS = 10
LR = 0.05
SEED = 2024


class HookState:
    def __init__(self, process_group, world_size, accum_steps):
        self.process_group = process_group
        self.world_size = world_size
        self.accum_steps = accum_steps


def fp32_mean_hook(state, bucket):
    """Average the bucket over ranks, in fp32."""
    buf = bucket.buffer()
    dtype = buf.dtype
    t = buf.to(torch.float32).div_(state.world_size)
    fut = dist.all_reduce(t, group=state.process_group, async_op=True).get_future()

    def _back(f):
        out = f.value()[0]
        buf.copy_(out.to(dtype))
        return buf

    return fut.then(_back)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic_batches(rank):
    g = torch.Generator().manual_seed(SEED + rank)
    while True:
        x = torch.randn(MICRO_BATCH, 1, 16, 16, generator=g)
        y = (x.mean(dim=(1, 2, 3)) * 7).long().clamp(-2, 2) + 2
        yield x, y


def sha_of(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    model = DDP(ConvNet())
    model.register_comm_hook(HookState(None, world, GRAD_ACCUM), fp32_mean_hook)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=LR, momentum=0.9)

    data = synthetic_batches(rank)
    for step in range(OPT_STEPS):
        for micro in range(GRAD_ACCUM):
            x, y = next(data)
            last = micro == GRAD_ACCUM - 1
            if last:
                loss = F.cross_entropy(model(x), y) / GRAD_ACCUM
                loss.backward()
            else:
                with model.no_sync():
                    loss = F.cross_entropy(model(x), y) / GRAD_ACCUM
                    loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sha = sha_of(model.module)
    if rank == 0:
        print("FINAL_SHA256", sha, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
