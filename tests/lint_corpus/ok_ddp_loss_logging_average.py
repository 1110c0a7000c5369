# corpus: style=ddp class=OK
# The loss is all-reduced and divided by the world size for logging only.
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
world_size = dist.get_world_size()
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    logged = logged / world_size
    if dist.get_rank() == 0 and step % 10 == 0:
        print(f"step {step} loss {logged.item():.4f}")
