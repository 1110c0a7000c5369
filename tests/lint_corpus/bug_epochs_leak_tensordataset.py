# corpus: style=epochs class=F7
# 50 samples / batch 5 = 10 batches per epoch, K = 4: 2 micro-batches per epoch leak forward
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 4
features = torch.randn(50, 16)
targets = torch.randint(0, 3, (50,))
loader = DataLoader(TensorDataset(features, targets), batch_size=5, shuffle=True)
model = torch.nn.Linear(16, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for it, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / ACCUM).backward()
        if (it + 1) % ACCUM == 0:  # expect: AG117
            optimizer.step()
            optimizer.zero_grad()
