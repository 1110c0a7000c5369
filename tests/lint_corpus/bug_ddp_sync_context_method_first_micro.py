# corpus: style=trainer_class class=F11
# a trainer method picks the sync context from a plain counter `self.micro` (set to 0,
# bumped after each backward): `micro % K != 0` leaves DDP syncing on the window's FIRST
# backward, the later ones stay on their own rank
import contextlib

import torch


class Learner:
    def __init__(self, ddp_model, accum_micro=4):
        self.net = ddp_model
        self.accum_micro = accum_micro
        self.micro = 0
        self.opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)

    def _ctx(self):
        if self.micro % self.accum_micro:
            return self.net.no_sync()  # expect: AG111
        return contextlib.nullcontext()

    def one(self, x, y):
        with self._ctx():
            loss = torch.nn.functional.mse_loss(self.net(x), y) / self.accum_micro
            loss.backward()
        self.micro += 1

    def train(self, batches):
        for window in batches:
            for x, y in window:
                self.one(x, y)
            self.opt.step()
            self.opt.zero_grad()
