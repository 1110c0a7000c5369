# corpus: style=trainer_class class=OK
from contextlib import nullcontext

import torch

ACCUM = 4


class Trainer:
    def __init__(self, model, opt, loader):
        self.model, self.opt, self.loader = model, opt, loader

    def micro_step(self, batch, sync):
        with nullcontext() if sync else self.model.no_sync():
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y) / ACCUM
            loss.backward()
        return loss.detach()

    def fit(self, updates):
        it = iter(self.loader)
        for _ in range(updates):
            window = [next(it) for _ in range(ACCUM)]
            losses = [self.micro_step(b, sync=(j == ACCUM - 1)) for j, b in enumerate(window)]
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            print(sum(losses).item())
