# corpus: style=ddp class=OK
# a trainer class flushes the pass's last partial window (its boundary predicate is a method)
# and divides each micro-batch's loss by its window's own length
import contextlib

import torch


class Trainer:
    def __init__(self, model, opt, loss_fn, accum_steps):
        self.model, self.opt, self.loss_fn = model, opt, loss_fn
        self.accum_steps = accum_steps

    def _is_boundary(self, i, n):
        return (i + 1) % self.accum_steps == 0 or (i + 1) == n

    def train_epoch(self, xs, ys):
        n = len(xs)
        for i, (x, y) in enumerate(zip(xs, ys)):
            boundary = self._is_boundary(i, n)
            window_len = min(self.accum_steps, n - (i // self.accum_steps) * self.accum_steps)
            ctx = contextlib.nullcontext() if boundary else self.model.no_sync()
            with ctx:
                loss = self.loss_fn(self.model(x), y) / window_len
                loss.backward()
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)


def main(model, xs, ys):
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    Trainer(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), torch.nn.MSELoss(), 4).train_epoch(xs, ys)
