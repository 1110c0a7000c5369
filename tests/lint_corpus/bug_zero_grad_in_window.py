# corpus: style=plain class=F3
import torch
from torch import nn


def train(model: nn.Module, loader, grad_accum: int = 4) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()  # expect: AG102
        loss = nn.functional.mse_loss(model(x), y) / grad_accum
        loss.backward()
        if (i + 1) % grad_accum == 0:
            opt.step()
