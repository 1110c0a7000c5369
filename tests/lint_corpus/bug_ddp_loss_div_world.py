# corpus: style=ddp class=F10
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

world_size = dist.get_world_size()
model = DDP(net)
accum_steps = 2
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss = loss / (accum_steps * world_size)  # expect: AG112
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
