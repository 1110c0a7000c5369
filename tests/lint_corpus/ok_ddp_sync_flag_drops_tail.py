# corpus: style=ddp class=OK
import contextlib

import torch

accumulation_steps = 4
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accumulation_steps == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation_steps
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    optimizer.zero_grad()  # the epoch's partial window is dropped, not leaked
