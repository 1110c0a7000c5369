# corpus: style=ddp class=F11
from contextlib import nullcontext

import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, opt, k):
        self.model = DDP(model)
        self.opt = opt
        self.k = k

    def train(self, windows):
        for window in windows:
            for idx, (xb, yb) in enumerate(window):
                sync = idx % self.k == 0
                with nullcontext() if sync else self.model.no_sync():  # expect: AG111
                    loss = F.cross_entropy(self.model(xb), yb) / self.k
                    loss.backward()
            self.opt.step()
            self.opt.zero_grad()
