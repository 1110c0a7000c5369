# corpus: style=fsdp2 class=OK
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for step in range(steps):
    micro = [next(it) for _ in range(num_micro_batches)]
    model.set_requires_gradient_sync(False)
    for mb in micro[:-1]:
        (model(mb).sum() / total).backward()
    model.set_requires_gradient_sync(True)
    (model(micro[-1]).sum() / total).backward()
    optimizer.step()
    optimizer.zero_grad()
