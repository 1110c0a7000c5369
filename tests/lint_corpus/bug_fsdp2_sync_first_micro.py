# corpus: style=fsdp2 class=F11
from torch.distributed.fsdp import fully_shard

for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
for step in range(num_steps):
    for micro in range(accum_steps):
        model.set_requires_gradient_sync(micro == 0)  # expect: AG111
        loss = model(next(batches)).mean() / accum_steps
        loss.backward()
    optim.step()
    optim.zero_grad()
