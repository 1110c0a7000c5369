# corpus: style=trainer class=OK
# the boundary method called: a step once per window of 4
import torch


class Trainer:
    def __init__(self, model, accum=4):
        self.model, self.accum, self.micro = model, accum, 0
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def last_micro_step(self):
        return (self.micro + 1) % self.accum == 0

    def train(self, loader):
        for x, y in loader:
            (torch.nn.functional.mse_loss(self.model(x), y) / self.accum).backward()
            if self.last_micro_step():
                self.opt.step()
                self.opt.zero_grad()
            self.micro += 1


Trainer(model).train(loader)
