# corpus: style=ddp class=F10
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4


def compute_loss(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    return loss / dist.get_world_size()  # expect: AG112


def train(model, loader):
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        loss = compute_loss(model, x, y) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
