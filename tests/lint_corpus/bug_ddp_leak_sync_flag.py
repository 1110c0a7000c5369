# corpus: style=ddp class=F7
import contextlib

import torch
from torch.utils.data import DataLoader, TensorDataset

accumulation_steps = 4
loader = DataLoader(TensorDataset(torch.randn(40, 10), torch.randint(0, 2, (40,))), batch_size=4)
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accumulation_steps == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation_steps
            loss.backward()
        if sync:  # expect: AG117
            optimizer.step()
            optimizer.zero_grad()
