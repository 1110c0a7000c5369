# corpus: style=ddp class=OK
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for i, batch in enumerate(loader):
    sync_now = (i + 1) % accum == 0
    with contextlib.ExitStack() as stack:
        if not sync_now:
            stack.enter_context(model.no_sync())
        (model(batch).sum() / accum).backward()
    if sync_now:
        optimizer.step()
        optimizer.zero_grad()
