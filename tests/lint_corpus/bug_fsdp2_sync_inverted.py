# corpus: style=fsdp2 class=F11
from torch.distributed.fsdp import fully_shard

fully_shard(model)
accum = 4
for step in range(steps):
    for micro in range(accum):
        model.set_requires_gradient_sync(micro < accum - 1)  # expect: AG111
        loss = model(next(batches)).mean() / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
