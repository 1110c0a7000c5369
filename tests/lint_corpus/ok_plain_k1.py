# corpus: style=k1 class=OK
"""Plain training, no accumulation: step every batch is correct."""
import torch
from torch import nn

model = nn.Linear(10, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
loader = [(torch.randn(8, 10), torch.randn(8, 1)) for _ in range(10)]

for epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
