# corpus: style=fsdp2 class=OK
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for step in range(num_steps):
    for micro in range(accum_steps):
        # off only on the first micro-step: the last one reduces the whole window
        model.set_requires_gradient_sync(micro > 0)
        loss = model(next(batches)).mean() / accum_steps
        loss.backward()
    optim.step()
    optim.zero_grad()
