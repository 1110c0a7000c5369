# corpus: style=fsdp2 class=F3
"""FSDP2 reducing on every micro-step; the loop clears at the top of each micro-step."""
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
            opt.zero_grad(set_to_none=True)  # expect: AG102
            (F.cross_entropy(model(x), y) / ACCUM).backward()
        opt.step()
