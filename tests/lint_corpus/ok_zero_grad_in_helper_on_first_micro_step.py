# corpus: style=plain class=OK
# a helper clears when its caller says this is the window's first micro-step
import torch
K = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def fb(x, first):
    if first:
        opt.zero_grad()
    (model(x).sum() / K).backward()


for step in range(10):
    for i in range(K):
        fb(next(it), first=(i == 0))
    opt.step()
