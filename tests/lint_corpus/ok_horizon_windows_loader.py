# corpus: style=nanogpt class=OK
import torch

accum_steps = 4
# the loader yields whole windows: len(window_loader) counts optimizer steps
scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=len(window_loader))
for window in window_loader:
    for micro in window.chunk(accum_steps):
        loss = model(micro).mean() / accum_steps
        loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
