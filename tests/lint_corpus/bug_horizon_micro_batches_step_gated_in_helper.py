# corpus: style=trainer class=F4
# the cosine horizon counts micro-batches; the scheduler steps in a helper, under a flag a
# boundary method returns, once per window of K: the schedule is K times too long
import torch


class Trainer:
    def __init__(self, model, loader, epochs, accum):
        self.model, self.loader, self.epochs, self.accum = model, loader, epochs, accum
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(  # expect: AG124
            self.opt, T_max=epochs * len(self.loader))
        self.micro = 0

    def _at_boundary(self):
        return (self.micro + 1) % self.accum == 0

    def _train_step(self, x, y):
        last = self._at_boundary()
        (torch.nn.functional.mse_loss(self.model(x), y) / self.accum).backward()
        if last:
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
        self.micro += 1

    def fit(self):
        for _ in range(self.epochs):
            for x, y in self.loader:
                self._train_step(x, y)


Trainer(model, loader, epochs=3, accum=4).fit()
