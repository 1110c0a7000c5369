# corpus: style=fsdp2 class=OK
# Clipping the sharded parameters: the global norm; the local pieces only for a log.
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


def train(model, loader, k, max_norm):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step, window in enumerate(loader):
        for i, (x, y) in enumerate(window):
            model.set_requires_gradient_sync(i == k - 1)
            (F.cross_entropy(model(x), y) / k).backward()
        local = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        print(torch.nn.utils.get_total_norm(local))
        opt.step()
        opt.zero_grad()
