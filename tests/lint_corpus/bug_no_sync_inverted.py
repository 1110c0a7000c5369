# corpus: style=ddp class=F11
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for i, batch in enumerate(loader):
    is_last = (i + 1) % K == 0
    ctx = model.no_sync() if is_last else contextlib.nullcontext()  # expect: AG111
    with ctx:
        (model(batch).sum() / K).backward()
    if is_last:
        optimizer.step()
        optimizer.zero_grad()
