# corpus: style=trainer class=OK
"""The fixed twins of bug_ddp_head_replaced_after_wrap: the head is replaced before the
wrap, or the model is wrapped again after it."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class FineTuner:
    def __init__(self, model, d_model):
        self.model, self.d_model = model, d_model
        self.ddp = None

    def wrap(self):
        self.ddp = DDP(self.model, find_unused_parameters=True)

    def reset_head(self, classes):
        self.model.head = nn.Linear(self.d_model, classes)

    def build_optimizer(self):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)


def main(model):
    t = FineTuner(model, 64)
    t.reset_head(5)
    t.wrap()
    t.build_optimizer()


def rewrapped(model):
    t = FineTuner(model, 64)
    t.wrap()
    t.reset_head(5)
    t.wrap()
    t.build_optimizer()


def plain(model, loader, k):
    model.classifier = nn.Linear(64, 3)
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        (nn.functional.cross_entropy(ddp(x), y) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
