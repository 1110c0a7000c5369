# corpus: style=plain class=OK
# An optimizer wrapper the loop calls on every micro-batch (zero_grad, backward, step): it
# clears only when nothing is pending (the window's first micro-batch) and steps at K.
import torch

K = 4


class Accumulating:
    def __init__(self, optimizer, accum):
        self.optimizer = optimizer
        self.accum = accum
        self.pending = 0

    def zero_grad(self):
        if self.pending == 0:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self):
        self.pending += 1
        if self.pending == self.accum:
            self.optimizer.step()
            self.pending = 0


def train(model, batches):
    opt = Accumulating(torch.optim.SGD(model.parameters(), lr=0.1), K)
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y) / K
        loss.backward()
        opt.step()
