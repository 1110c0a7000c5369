# corpus: style=ddp class=OK
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4


def train(net, batches, steps):
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    it = iter(batches)
    for _ in range(steps):
        with model.no_sync():
            for _ in range(ACCUM - 1):
                x, y = next(it)
                (F.cross_entropy(model(x), y) / ACCUM).backward()
        x, y = next(it)
        (F.cross_entropy(model(x), y) / ACCUM).backward()  # synced: reduces the whole window
        opt.step()
        opt.zero_grad()
