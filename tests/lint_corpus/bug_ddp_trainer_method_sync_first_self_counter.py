# corpus: style=trainer_class class=F11
# the trainer's micro-step counter is an attribute, tested before it is incremented: the sync
# falls on the window's first micro-step and the step on its last
import contextlib

import torch.nn.functional as F


class Trainer:
    def __init__(self, ddp, opt, accum_steps):
        self.ddp, self.opt, self.K = ddp, opt, accum_steps
        self.micro_step = 0

    def train_micro(self, x, y):
        sync = self.micro_step % self.K == 0
        ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()  # expect: AG111
        with ctx:
            loss = F.mse_loss(self.ddp(x), y) / self.K
            loss.backward()
        self.micro_step += 1
        if self.micro_step % self.K == 0:
            self.opt.step()
            self.opt.zero_grad()

    def fit(self, loader):
        for x, y in loader:
            self.train_micro(x, y)


Trainer(ddp, opt, accum_steps=3).fit(loader)
