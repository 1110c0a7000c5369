# corpus: style=ddp class=OK
# the classifier is swapped before DDP wraps the model
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(net, loader, n_classes, k=2):
    net.classifier = torch.nn.Linear(64, n_classes)
    ddp = DDP(net, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.cross_entropy(ddp(x), y) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
