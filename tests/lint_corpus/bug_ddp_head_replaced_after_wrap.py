# corpus: style=trainer class=F10
"""A fine-tuning trainer that wraps the model in DDP, then swaps in a new task head: DDP
never registered the new head's parameters (find_unused_parameters hides the old head), so
its gradients are never averaged (blind round 125 a_b01)."""
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
        self.model.head = nn.Linear(self.d_model, classes)  # expect: AG196

    def build_optimizer(self):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)


def main(model):
    t = FineTuner(model, 64)
    t.wrap()
    t.reset_head(5)
    t.build_optimizer()


def plain(model, loader, k):
    ddp = DDP(model, find_unused_parameters=True)
    model.classifier = nn.Linear(64, 3)  # expect: AG196
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        (nn.functional.cross_entropy(ddp(x), y) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
