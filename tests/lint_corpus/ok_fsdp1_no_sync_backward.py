# corpus: style=fsdp class=OK
# FSDP (v1) reads its no_sync state in the post-backward hook, not at the forward:
# no_sync around the backward alone does skip the reduce-scatter.
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(net)
optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
accum = 4
for step, batch in enumerate(loader):
    loss = model(**batch).loss / accum
    if (step + 1) % accum != 0:
        with model.no_sync():
            loss.backward()
    else:
        loss.backward()
        optim.step()
        optim.zero_grad()
