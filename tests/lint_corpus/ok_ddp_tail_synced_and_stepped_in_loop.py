# corpus: style=ddp class=OK
"""A DDP trainer class whose last micro-batch of the epoch closes a window too: synced and
stepped inside the loop."""
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
        n = len(self.loader)
        for idx, (x, y) in enumerate(self.loader):
            boundary = (idx + 1) % K == 0 or idx + 1 == n
            size = K if idx < n - n % K else n % K
            ctx = nullcontext() if boundary else self.model.no_sync()
            with ctx:
                loss = F.mse_loss(self.model(x), y) / size
                loss.backward()
            if boundary:
                self.optimizer_step()
