# corpus: style=trainer_class class=OK
import torch


class AccumulatingOptimizer:
    def __init__(self, optimizer, accumulative_counts=4):
        self.optimizer = optimizer
        self.accumulative_counts = accumulative_counts
        self._inner = 0

    def step(self):
        self._inner += 1
        if self._inner % self.accumulative_counts == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()


def train(model, loader):
    optim_wrapper = AccumulatingOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=4)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y) / optim_wrapper.accumulative_counts
        loss.backward()
        optim_wrapper.step()
