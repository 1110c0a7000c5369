# corpus: style=fsdp2 class=F11
# the sync predicate is true on the first micro-step of each window, the update predicate on
# the last: the stepping micro-step's gradient is never reduce-scattered
import torch
from torch.distributed.fsdp import fully_shard


def is_sync_step(micro_step, accum):
    return micro_step % accum == 0


def is_update_step(micro_step, accum):
    return (micro_step + 1) % accum == 0


def train(model, loader, accum, loss_fn):
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for micro_step, (x, y) in enumerate(loader):
        model.set_requires_gradient_sync(is_sync_step(micro_step, accum))  # expect: AG111
        (loss_fn(model(x), y) / accum).backward()
        if is_update_step(micro_step, accum):
            opt.step()
            opt.zero_grad()
