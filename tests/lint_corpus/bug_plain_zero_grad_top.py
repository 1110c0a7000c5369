# corpus: style=plain class=F3
import torch

ACCUM = 4
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad()  # expect: AG102
    loss = criterion(model(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        optimizer.step()
