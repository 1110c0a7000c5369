# corpus: style=plain class=OK
import torch
from torch import nn

accum_steps = 4
model = nn.Linear(10, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
loader = [(torch.randn(8, 10), torch.randn(8, 1)) for _ in range(16)]

optimizer.zero_grad()
for i, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0 or i == len(loader) - 1:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
