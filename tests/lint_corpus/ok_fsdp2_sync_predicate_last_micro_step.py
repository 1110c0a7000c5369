# corpus: style=fsdp2 class=OK
# the sync predicate and the update predicate are both true on the last micro-step of each
# window: the stepping micro-step reduce-scatters the accumulated gradient
import torch
from torch.distributed.fsdp import fully_shard


def is_sync_step(micro_step, accum):
    return (micro_step + 1) % accum == 0


def is_update_step(micro_step, accum):
    return (micro_step + 1) % accum == 0


def train(model, loader, accum, loss_fn):
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for micro_step, (x, y) in enumerate(loader):
        model.set_requires_gradient_sync(is_sync_step(micro_step, accum))
        (loss_fn(model(x), y) / accum).backward()
        if is_update_step(micro_step, accum):
            opt.step()
            opt.zero_grad()
