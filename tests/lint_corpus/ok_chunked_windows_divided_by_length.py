# corpus: style=ddp class=OK
# the same windows, each loss divided by its own window's length
import itertools

import torch

ACCUM = 4
for epoch in range(epochs):
    for window in itertools.batched(loader, ACCUM):
        for x, y in window:
            loss = torch.nn.functional.mse_loss(model(x), y) / len(window)
            loss.backward()
        opt.step()
        opt.zero_grad()
