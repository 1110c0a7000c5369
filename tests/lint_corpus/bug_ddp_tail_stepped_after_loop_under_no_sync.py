# corpus: style=ddp class=F11
"""A DDP trainer class that syncs at multiples of K only and steps the epoch's leftover
micro-batches after the loop: their backwards all ran under no_sync (blind round 121
a_b03)."""
from contextlib import nullcontext

import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, loader, k):
        self.model, self.loader, self.k = model, loader, k
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train_epoch(self):
        K = self.k
        for idx, (x, y) in enumerate(self.loader):
            boundary = (idx + 1) % K == 0
            ctx = nullcontext() if boundary else self.model.no_sync()
            with ctx:
                loss = F.mse_loss(self.model(x), y) / K
                loss.backward()
            if boundary:
                self.optimizer_step()
        if len(self.loader) % K:
            self.optimizer_step()  # expect: AG342
