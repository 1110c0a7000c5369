# corpus: style=ddp class=OK
# skips the all-reduce on the first micro-step only: every later one, the last included,
# all-reduces (DDP averages the accumulated gradient again): right result, some waste
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for micro in range(accum_steps):
    ctx = model.no_sync() if micro == 0 else contextlib.nullcontext()
    with ctx:
        (model(batch[micro]).sum() / accum_steps).backward()
optimizer.step()
optimizer.zero_grad()
