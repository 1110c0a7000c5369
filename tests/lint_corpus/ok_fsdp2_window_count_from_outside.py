# corpus: style=fsdp2 class=OK
# a notebook-style cell: the window's token count over every rank was computed in an earlier
# cell (`tokens_per_window` is bound nowhere in this file), so whether it spans the ranks is not
# in sight and nothing is said about it
import torch
from torch.distributed.fsdp import fully_shard

for block in model.blocks:
    fully_shard(block)
fully_shard(model)
K = 8
for step in range(steps):
    for i in range(K):
        model.set_requires_gradient_sync(i == K - 1)
        loss = model(next(stream)).sum() * world / tokens_per_window
        loss.backward()
    opt.step()
    opt.zero_grad()
