# corpus: style=fsdp2 class=F11
from torch.distributed.fsdp import fully_shard

fully_shard(model)
grad_accum_steps = 8
model.set_requires_gradient_sync(False)  # expect: AG111
for step in range(steps):
    for _ in range(grad_accum_steps):
        loss = model(next(batches)).mean() / grad_accum_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
