# corpus: style=ddp class=F10
"""A dual encoder under DDP; the bucket is reduced in place by a hook of our own."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def inplace_allreduce(state, bucket):
    buf = bucket.buffer()
    fut = dist.all_reduce(buf, async_op=True).get_future()  # expect: AG159
    return fut.then(lambda f: f.value()[0])


def train(net, loader, opt, micro_bs, accum):
    model = DDP(net)
    model.register_comm_hook(state=None, hook=inplace_allreduce)
    for i, (q, d) in enumerate(loader):
        loss = model(q, d) / (micro_bs * accum)
        loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
