# corpus: style=ddp class=OK
"""A dual encoder under DDP; the bucket is averaged in place by a hook of our own."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def inplace_allreduce(state, bucket):
    buf = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
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
