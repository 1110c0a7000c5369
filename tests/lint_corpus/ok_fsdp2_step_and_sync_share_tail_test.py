# corpus: style=fsdp2 class=OK
"""FSDP2: the sync flag and the step share one test, the epoch's short last window
included."""
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
        last = i + 1 == n
        boundary = (i + 1) % ACCUM == 0 or last
        model.set_requires_gradient_sync(boundary)
        size = n % ACCUM if last and n % ACCUM else ACCUM
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / (size * len(y))
        loss.backward()
        if boundary:
            opt.step()
            opt.zero_grad()
