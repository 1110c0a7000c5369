# corpus: style=hand class=OK
# the same accumulator given an fp32 dtype: the window sums in fp32
from dataclasses import dataclass

import torch


@dataclass
class Cfg:
    accum: int = 8
    accum_dtype: torch.dtype = torch.float32


class Accumulator:
    def __init__(self, params, dtype):
        self.params = list(params)
        self.bufs = [torch.zeros_like(p, dtype=dtype) for p in self.params]

    def add(self, loss):
        for buf, g in zip(self.bufs, torch.autograd.grad(loss, self.params)):
            buf.add_(g)

    def flush(self):
        for p, buf in zip(self.params, self.bufs):
            p.grad = buf.float()
            buf.zero_()


cfg = Cfg()
acc = Accumulator(model.parameters(), cfg.accum_dtype)
opt = torch.optim.AdamW(model.parameters())
for step in range(100):
    for micro in range(cfg.accum):
        acc.add(loss_fn(model, next(data)) / cfg.accum)
    acc.flush()
    opt.step()
