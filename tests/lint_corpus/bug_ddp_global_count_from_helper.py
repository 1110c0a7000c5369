# corpus: style=trainer class=F10
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def sum_ce(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")


class Trainer:
    def __init__(self, model, accum=4):
        self.model = DDP(model)
        self.accum = accum
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def _count_tokens(self, window):
        n = torch.tensor(float(sum((y != -100).sum() for _, y in window)))
        dist.all_reduce(n, op=dist.ReduceOp.SUM)
        return n

    def train_window(self, window):
        global_tokens = self._count_tokens(window)
        for i, (x, y) in enumerate(window):
            loss = sum_ce(self.model(x), y) / global_tokens  # expect: AG123
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
