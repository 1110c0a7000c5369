# corpus: style=ddp class=F10
# a comm hook that times the all-reduce for a profiler: it sums the bucket and returns the
# result as is, so every .grad is the ranks' sum instead of DDP's average
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def timed_hook(state, bucket):
    t0 = time.perf_counter()
    work = dist.all_reduce(bucket.buffer(), async_op=True)  # expect: AG159

    def done(fut):
        state["seconds"] += time.perf_counter() - t0
        return fut.value()[0]

    return work.get_future().then(done)


def train(model, loader, accum=4):
    dist.init_process_group("gloo")
    ddp = DDP(model)
    stats = {"seconds": 0.0}
    ddp.register_comm_hook(stats, timed_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        boundary = (i + 1) % accum == 0
        if boundary:
            loss = torch.nn.functional.mse_loss(ddp(x), y) / accum
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            with ddp.no_sync():
                loss = torch.nn.functional.mse_loss(ddp(x), y) / accum
                loss.backward()
