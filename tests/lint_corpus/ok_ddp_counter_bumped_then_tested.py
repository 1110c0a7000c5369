# corpus: style=trainer_class class=OK
# the counter is incremented before its test and tested as counting from 1: the last micro-step syncs
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Loop:
    def __init__(self, net, accum=4):
        self.ddp = DDP(net)
        self.accum = accum
        self.seen = 0
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1)

    def one(self, x, y):
        self.seen += 1
        last = self.seen % self.accum == 0
        with contextlib.nullcontext() if last else self.ddp.no_sync():
            (torch.nn.functional.mse_loss(self.ddp(x), y) / self.accum).backward()

    def run(self, windows):
        for window in windows:
            for x, y in window:
                self.one(x, y)
            self.opt.step()
            self.opt.zero_grad()
