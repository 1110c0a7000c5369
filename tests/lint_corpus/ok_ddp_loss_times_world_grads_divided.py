# corpus: style=ddp class=OK
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(model, windows, opt):
    world = dist.get_world_size()
    ddp = DDP(model)
    for window in windows:
        for x, y in window:
            # each rank's mean times W (a loss kept from a summing reduction): DDP's average
            # gives the sum of the ranks' means, which the division below makes their mean
            (F.mse_loss(ddp(x), y) * world / len(window)).backward()
        for p in ddp.parameters():
            p.grad.div_(world)
        opt.step()
        opt.zero_grad()
