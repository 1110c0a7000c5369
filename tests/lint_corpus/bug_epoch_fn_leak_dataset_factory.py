# corpus: style=trainer_class class=F7
import torch
from torch.utils.data import DataLoader, TensorDataset

ROWS = 70
accumulation = 3


def toy_dataset():
    x = torch.rand(ROWS, 6)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Loop:
    def __init__(self, net, optim):
        self.net, self.optim = net, optim
        self.loader = DataLoader(toy_dataset(), batch_size=10)

    def train_epoch(self):
        for k, (inp, out) in enumerate(self.loader):
            loss = torch.nn.functional.mse_loss(self.net(inp), out) / accumulation
            loss.backward()
            if (k + 1) % accumulation == 0:  # expect: AG117
                self.optim.step()
                self.optim.zero_grad()
