# corpus: style=plain class=OK
"""Windows counted from 0 each epoch, and the loop stops at the last full window
(`if i >= full: break`): the leftover never runs, nothing is left in .grad for the next
epoch (blind round 124 a_b03's fixed twin, single process)."""
import torch
import torch.nn.functional as F


def train(model, loader, k, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    full = len(loader) - len(loader) % k
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            if i >= full:
                break
            (F.mse_loss(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad()
