# corpus: style=plain class=OK
# the clear opens each window (its first micro-step): nothing of the window is erased
import torch
K = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(10):
    for i in range(K):
        if i == 0:
            opt.zero_grad()
        (model(next(it)).sum() / K).backward()
    opt.step()
