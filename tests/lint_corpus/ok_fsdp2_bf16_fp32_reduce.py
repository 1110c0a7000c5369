# corpus: style=fsdp2 class=OK
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

grad_accum_steps = 256
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for block in model.layers:
    fully_shard(block, mp_policy=policy)
fully_shard(model, mp_policy=policy)
for step in range(max_steps):
    for micro in range(grad_accum_steps):
        model.set_requires_gradient_sync(micro == grad_accum_steps - 1)
        loss = model(next(it)).float().mean() / grad_accum_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
