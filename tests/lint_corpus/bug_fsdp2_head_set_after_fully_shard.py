# corpus: style=fsdp2 class=F10
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard


def build(backbone, n_classes):
    for layer in backbone.layers:
        fully_shard(layer)
    fully_shard(backbone)
    backbone.classifier = nn.Linear(backbone.dim, n_classes)  # expect: AG196
    return backbone


def train(backbone, loader, k=4):
    model = build(backbone, 10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(loader):
        model.set_requires_gradient_sync((i + 1) % k == 0)
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
