# corpus: style=ddp class=OK
# the same loop deciding the sync against the window's own length: short windows sync too
from contextlib import nullcontext

import torch.nn.functional as F


def chunked(loader, k):
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == k:
            yield window
            window = []
    if window:
        yield window


for epoch in range(epochs):
    for window in chunked(loader, ACCUM):
        for j, (x, y) in enumerate(window):
            ctx = ddp_model.no_sync() if j < len(window) - 1 else nullcontext()
            with ctx:
                loss = F.cross_entropy(ddp_model(x), y) / len(window)
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
