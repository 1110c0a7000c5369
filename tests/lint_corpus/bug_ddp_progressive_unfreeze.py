# corpus: style=ddp class=F10
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 2
UNFREEZE_AT = 100


def train(net, batches, steps):
    for p in net.backbone.parameters():
        p.requires_grad_(False)
    net.backbone.requires_grad_(False)
    model = DDP(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    it = iter(batches)
    for step in range(steps):
        if step == UNFREEZE_AT:
            net.backbone.requires_grad_(True)  # expect: AG301
        for k in range(K):
            x, y = next(it)
            with model.no_sync() if k < K - 1 else torch.enable_grad():
                (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
