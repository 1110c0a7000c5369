# corpus: style=plain class=OK
import torch

grad_accum_steps = 4
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
n = len(loader)
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / grad_accum_steps  # expect: AG141
    loss.backward()
    if (i + 1) % grad_accum_steps == 0 or (i + 1) == n:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
