# corpus: style=fsdp2 class=F10
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

fully_shard(model)
ws = dist.get_world_size()
for batch in loader:
    loss = model(batch).sum() / len(batch)
    (loss / ws).backward()  # expect: AG112
    optimizer.step()
    optimizer.zero_grad()
