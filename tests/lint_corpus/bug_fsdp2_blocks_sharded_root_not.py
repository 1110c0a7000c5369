# corpus: style=fsdp2 class=F10
"""FSDP2 on a small residual MLP: every block its own unit."""
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self, d_in, d, n_cls, n_blocks):
        super().__init__()
        self.stem = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d))
                                     for _ in range(n_blocks)])
        self.head = nn.Linear(d, n_cls)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def train(loader, accum, mesh):
    model = Net(32, 64, 10, 4)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)  # expect: AG166
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % accum == 0
        model.set_requires_gradient_sync(last)
        (torch.nn.functional.cross_entropy(model(x), y) / accum).backward()
        if last:
            opt.step()
            opt.zero_grad()
