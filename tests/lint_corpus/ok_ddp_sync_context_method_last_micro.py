# corpus: style=trainer_class class=OK
# the same trainer syncing on the window's last backward: `(micro + 1) % K != 0` is no_sync
# on every backward but the last
import contextlib

import torch


class Learner:
    def __init__(self, ddp_model, accum_micro=4):
        self.net = ddp_model
        self.accum_micro = accum_micro
        self.micro = 0
        self.opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)

    def _ctx(self):
        if (self.micro + 1) % self.accum_micro:
            return self.net.no_sync()
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
