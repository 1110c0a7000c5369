# corpus: style=ddp class=OK
# no_sync around the backward alone: DDP armed the all-reduce at the forward, so every
# micro-step syncs. Correct (the average is taken every time), only wasteful: a note.
import torch
from torch.nn.parallel import DistributedDataParallel


def train(model, optimizer, loader, accum_iter):
    ddp_model = DistributedDataParallel(model)
    for it, (x, y) in enumerate(loader):
        out = ddp_model(x)
        loss = torch.nn.functional.mse_loss(out, y) / accum_iter
        if (it + 1) % accum_iter != 0:
            with ddp_model.no_sync():  # expect: AG116
                loss.backward()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
