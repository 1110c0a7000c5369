# corpus: style=fsdp2 class=OK
import torch
from torch.distributed.fsdp import fully_shard

for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
K = 4
for step in range(steps):
    for micro in range(K):
        is_last = micro == K - 1
        model.set_requires_gradient_sync(is_last)
        loss = model(next(batches)).sum() / K
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
