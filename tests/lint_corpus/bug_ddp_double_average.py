# corpus: style=ddp class=F10
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, optimizer, loader, grad_accum_steps):
    model = DDP(model)
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / grad_accum_steps
        loss.backward()
        if (i + 1) % grad_accum_steps == 0:
            for p in model.parameters():
                dist.all_reduce(p.grad)  # expect: AG108
            optimizer.step()
            optimizer.zero_grad()
