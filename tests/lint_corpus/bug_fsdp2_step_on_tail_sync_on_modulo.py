# corpus: style=fsdp2 class=F7
"""FSDP2: the optimizer also steps on the epoch's short last window, but the sync flag only
turns on at the modulo boundary: that window is never reduce-scattered."""
import torch
from torch.distributed.fsdp import fully_shard

ACCUM = 4
model = build_model()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for epoch in range(3):
    batches = list(epoch_batches(epoch))
    n = len(batches)
    for i, (x, y) in enumerate(batches):
        boundary = (i + 1) % ACCUM == 0
        model.set_requires_gradient_sync(boundary)
        last = i + 1 == n
        size = n % ACCUM if last and n % ACCUM else ACCUM
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / (size * len(y))
        loss.backward()
        if boundary or last:  # expect: AG178
            opt.step()
            opt.zero_grad()
