# corpus: style=fsdp2 class=OK
"""FSDP2 with the sync deferred over the window; the loop clears at the top of each micro-step
(harmless: with sync off FSDP2 keeps the gradient on its unsharded parameters)."""
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

ACCUM = 4


def train(model, windows):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for window in windows:
        for j, (x, y) in enumerate(window):
            opt.zero_grad(set_to_none=True)
            model.set_requires_gradient_sync(j == ACCUM - 1)
            (F.cross_entropy(model(x), y) / ACCUM).backward()
        opt.step()
