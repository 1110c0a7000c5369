# corpus: style=ddp class=F10
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(model, loader, opt, accum=4):
    world = dist.get_world_size()
    ddp = DDP(model)
    for i, (x, y) in enumerate(loader):
        (F.mse_loss(ddp(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            for p in ddp.parameters():
                p.grad /= world  # expect: AG381
            opt.step()
            opt.zero_grad()
