# corpus: style=plain class=F1
import torch
from torch import nn

gradient_accumulation_steps = 8
model = nn.Linear(10, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(8, 10), torch.randn(8, 1)) for _ in range(64)]

for step, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y)
    loss = loss / gradient_accumulation_steps
    loss.backward()
    optimizer.step()  # expect: AG101
    optimizer.zero_grad()
