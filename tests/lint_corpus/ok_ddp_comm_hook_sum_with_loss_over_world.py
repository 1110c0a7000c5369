# corpus: style=ddp class=OK
# a summing hook on purpose: each rank's loss is already divided by the world size, so the
# ranks' sum is the large batch's mean
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def sum_hook(_, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
        lambda f: f.value()[0])


def train(model, loader, accum=2):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    ddp = DDP(model)
    ddp.register_comm_hook(None, sum_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accum == 0
        ddp.require_backward_grad_sync = sync
        loss = torch.nn.functional.cross_entropy(ddp(x), y) / (accum * world)
        loss.backward()
        if sync:
            opt.step()
            opt.zero_grad()
