# corpus: style=ddp class=OK
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
accum = 4
for i, (x, y) in enumerate(loader):
    boundary = (i + 1) % accum == 0
    ctx = contextlib.nullcontext() if boundary else model.no_sync()
    with ctx:
        loss = criterion(model(x), y) / accum
        loss.backward()
    if boundary:
        optimizer.step()
        optimizer.zero_grad()
