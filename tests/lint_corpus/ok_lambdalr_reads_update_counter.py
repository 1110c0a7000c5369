# corpus: style=trainer_class class=OK
# The schedule reads a counter of the trainer's own, incremented once per optimizer step.
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, k, warmup):
        self.model, self.k, self.warmup = model, k, warmup
        self.updates = 0
        self.micro = 0
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self.factor)

    def factor(self, _):
        return min(1.0, (self.updates + 1) / self.warmup)

    def micro_step(self, x, y, n):
        loss = F.cross_entropy(self.model(x), y, reduction="sum") / n
        loss.backward()
        self.micro += 1

    def update(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1
        self.sched.step()

    def fit(self, windows):
        for window in windows:
            n = sum(int(y.numel()) for _, y in window)
            for x, y in window:
                self.micro_step(x, y, n)
            self.update()
