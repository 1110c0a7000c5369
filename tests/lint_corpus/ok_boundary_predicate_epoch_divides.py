# corpus: style=epochs class=OK
import torch
from torch.utils.data import DataLoader, TensorDataset

GRAD_ACCUM = 5


def is_update_step(n):
    return n % GRAD_ACCUM == 0


model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loader = DataLoader(TensorDataset(torch.randn(60, 6), torch.randn(60, 1)), batch_size=6)
for epoch in range(4):
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.mse_loss(model(x), y) / GRAD_ACCUM).backward()
        if is_update_step(i + 1):
            opt.step()
            opt.zero_grad()
