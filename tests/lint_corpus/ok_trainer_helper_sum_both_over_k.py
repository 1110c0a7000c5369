# corpus: style=trainer class=OK
# both terms of the helper's sum are divided by K: the penalty counts once per update
import torch


class Trainer:
    def __init__(self, model, accum=4, l2=1e-3):
        self.model, self.accum, self.l2 = model, accum, l2
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def task(self, x, y):
        return torch.nn.functional.mse_loss(self.model(x), y) / self.accum

    def penalty(self):
        return self.l2 * sum(p.pow(2).sum() for p in self.model.parameters())

    def step_loss(self, x, y):
        return self.task(x, y) + self.penalty() / self.accum

    def window(self, batches):
        for x, y in batches:
            self.step_loss(x, y).backward()
        self.opt.step()
        self.opt.zero_grad()


t = Trainer(model)
for _ in range(10):
    t.window([next(data) for _ in range(t.accum)])
