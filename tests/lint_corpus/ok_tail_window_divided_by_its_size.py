# corpus: style=plain class=OK
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(40, 16), torch.randint(0, 4, (40,))), batch_size=4)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
K = 4
n = len(loader)
for epoch in range(3):
    for i, (xb, yb) in enumerate(loader):
        size = min(K, n - (i // K) * K)
        loss = F.cross_entropy(model(xb), yb) / size
        loss.backward()
        if (i + 1) % K == 0 or i + 1 == n:
            opt.step()
            opt.zero_grad()
