# corpus: style=plain class=OK
# The previous window is clipped and stepped at the top of the next micro-step, before its
# backward: the clip sees the whole window (the step is above the backward too).
import torch
import torch.nn.functional as F

K = 4


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        if i > 0 and i % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
