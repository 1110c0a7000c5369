# corpus: style=fsdp2 class=OK
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

# the sync stays on: every micro-batch is reduce-scattered and added to the fp32 shard's grad
accumulation_steps = 8
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
fully_shard(model, mp_policy=mp)
for step, batch in enumerate(loader):
    (model(batch).mean() / accumulation_steps).backward()
    if (step + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
