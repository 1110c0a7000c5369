# corpus: style=hand_loop class=F8
# value clipping installed as tensor hooks on the parameters: every micro-batch's gradient is
# clamped on its own before it is added to .grad, not the window's gradient once
import torch

accum = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for p in model.parameters():
    p.register_hook(lambda g: torch.clamp(g, -0.5, 0.5))  # expect: AG138
for i, (x, y) in enumerate(loader):
    (loss_fn(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
