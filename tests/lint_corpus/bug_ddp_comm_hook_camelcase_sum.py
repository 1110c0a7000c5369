# corpus: style=ddp_comm_hook class=F10
# A summing communication hook named in camelCase, losses each rank's own mean.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def sumHook(state, bucket):
    t = bucket.buffer()
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])  # expect: AG159


def train(model, loader, opt, K):
    model = DDP(model)
    model.register_comm_hook(None, sumHook)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
