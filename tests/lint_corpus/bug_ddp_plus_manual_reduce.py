# corpus: style=ddp class=F10
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(net)
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # expect: AG108
    optimizer.step()
