# corpus: style=ddp class=OK
# a trainer resuming mid-epoch skips the micro-batches already consumed (`if i < skip:
# continue`), then leaves every micro-step but the window's last with a second `continue`
# on a flag built from the modulo: the step after it runs at the boundary only
from contextlib import nullcontext

import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, opt, sched, loader, grad_accum):
        self.model, self.opt, self.sched, self.loader = model, opt, sched, loader
        self.grad_accum = grad_accum
        self.step = 0

    def fit(self, steps_per_epoch):
        K = self.grad_accum
        skip = (self.step % steps_per_epoch) * K
        self.opt.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(self.loader):
            if i < skip:
                continue
            last = (i + 1) % K == 0
            with (nullcontext() if last else self.model.no_sync()):
                loss = F.mse_loss(self.model(x), y) / K
                loss.backward()
            if not last:
                continue
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
