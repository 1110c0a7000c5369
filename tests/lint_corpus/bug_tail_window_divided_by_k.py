# corpus: style=plain class=F7
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(40, 16), torch.randint(0, 4, (40,))), batch_size=4)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
K = 4
for epoch in range(3):
    for i, (xb, yb) in enumerate(loader):
        loss = F.cross_entropy(model(xb), yb) / K  # expect: AG141
        loss.backward()
        if (i + 1) % K == 0 or i + 1 == len(loader):
            opt.step()
            opt.zero_grad()
