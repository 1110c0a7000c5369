# corpus: style=ddp class=F10
"""DDP with an fp32 communication hook of our own (bf16 buckets averaged in fp32)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 2


def fp32_avg(state, bucket):
    n = dist.get_world_size()
    buf = bucket.buffer().float() / n
    fut = dist.all_reduce(buf, op=dist.ReduceOp.AVG, async_op=True).get_future()  # expect: AG184
    return fut.then(lambda f: f.value()[0].to(bucket.buffer().dtype))


def train(model, batches):
    ddp = DDP(model)
    ddp.register_comm_hook(None, fp32_avg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches):
        (F.cross_entropy(ddp(x), y) / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
