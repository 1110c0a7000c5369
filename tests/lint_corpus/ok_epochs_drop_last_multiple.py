# corpus: style=epochs class=OK
# 64 samples, batch 4, drop_last: 16 batches per epoch, a multiple of K = 4: no leftover
import torch
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATION_STEPS = 4
data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=4, shuffle=True, drop_last=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    for step, (x, y) in enumerate(loader):
        (torch.nn.functional.cross_entropy(model(x), y) / ACCUMULATION_STEPS).backward()
        if (step + 1) % ACCUMULATION_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad()
