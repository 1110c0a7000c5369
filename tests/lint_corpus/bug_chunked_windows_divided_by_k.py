# corpus: style=ddp class=F7
# windows cut with itertools.batched; the last batch of a pass is short, each loss still / K
import itertools

import torch

ACCUM = 4
for epoch in range(epochs):
    for window in itertools.batched(loader, ACCUM):
        for x, y in window:
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM  # expect: AG307
            loss.backward()
        opt.step()
        opt.zero_grad()
