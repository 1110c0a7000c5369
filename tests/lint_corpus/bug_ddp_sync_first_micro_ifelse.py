# corpus: style=ddp class=F11
# "all-reduce once per window": but on the window's first micro-batch, not its last
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(build_model(), device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
grad_accum = 8
for i, (x, y) in enumerate(train_loader):
    if i % grad_accum == 0:
        loss = criterion(model(x), y) / grad_accum
        loss.backward()
    else:
        with model.no_sync():  # expect: AG111
            loss = criterion(model(x), y) / grad_accum
            loss.backward()
    if (i + 1) % grad_accum == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
