# corpus: style=accelerate class=OK
import torch
from accelerate import Accelerator

accelerator = Accelerator()
accum = 4
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for i, (x, y) in enumerate(loader):
    last = (i + 1) % accum == 0
    with accelerator.no_sync(model) if not last else torch.enable_grad():
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss / accum)
    if last:
        optimizer.step()
        optimizer.zero_grad()
