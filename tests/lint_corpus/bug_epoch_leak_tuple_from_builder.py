# corpus: style=plain class=F7
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 4


def setup():
    net = nn.Linear(6, 2)
    data = TensorDataset(torch.randn(20, 6), torch.randn(20, 2))
    return net, data


def fit(epochs=2):
    net, data = setup()
    batches = DataLoader(data, batch_size=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(epochs):
        for j, (x, y) in enumerate(batches):
            (nn.functional.mse_loss(net(x), y) / ACCUM).backward()
            if (j + 1) % ACCUM == 0:  # expect: AG117
                opt.step()
                opt.zero_grad()
