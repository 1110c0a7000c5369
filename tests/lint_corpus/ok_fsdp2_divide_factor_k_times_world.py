# corpus: style=fsdp2 class=OK
# each micro-batch's mean loss backwarded undivided; FSDP2 divides the window's sum over
# the ranks by K x W: the large batch's mean
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

ACCUM_STEPS = 4
world_size = dist.get_world_size()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
for m in model.modules():
    if hasattr(m, "set_gradient_divide_factor"):
        m.set_gradient_divide_factor(float(ACCUM_STEPS * world_size))
for step, window in enumerate(windows(loader, ACCUM_STEPS)):
    for i, (x, y) in enumerate(window):
        model.set_requires_gradient_sync(i == ACCUM_STEPS - 1)
        loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
