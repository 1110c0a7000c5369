# corpus: style=fsdp2 class=OK
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

ACCUM = 4


def train(model, loader):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    micro_step = 0
    for xb, yb in loader:
        micro_step += 1
        is_boundary = micro_step % ACCUM == 0
        model.set_requires_gradient_sync(is_boundary)
        loss = F.cross_entropy(model(xb), yb) / ACCUM
        loss.backward()
        if is_boundary:
            opt.step()
            opt.zero_grad()
