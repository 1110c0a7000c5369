# corpus: style=ddp class=F10
# the classifier is swapped on the DDP model's inner module: DDP never registered the new
# layer's parameters, so they are never averaged over the ranks
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(net, loader, n_classes, k=2):
    ddp = DDP(net, find_unused_parameters=True)
    ddp.module.classifier = torch.nn.Linear(64, n_classes)  # expect: AG196
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.cross_entropy(ddp(x), y) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
