# corpus: style=fsdp2 class=F11
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for step in range(steps):
    for mb in range(n_micro):
        model.set_requires_gradient_sync(False)  # expect: AG111
        (model(next(it)).sum() / n_micro).backward()
    optimizer.step()
    optimizer.zero_grad()
