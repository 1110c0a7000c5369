# corpus: style=fsdp2 class=F12
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

grad_accum_steps = 256
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # expect: AG126
for block in model.layers:
    fully_shard(block, mp_policy=policy)
fully_shard(model, mp_policy=policy)
for step, batch in enumerate(loader):
    model.set_requires_gradient_sync((step + 1) % grad_accum_steps == 0)
    loss = model(batch).float().mean() / grad_accum_steps
    loss.backward()
    if (step + 1) % grad_accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
