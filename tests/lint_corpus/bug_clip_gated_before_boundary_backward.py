# corpus: style=plain class=F8
# The clip is gated to the boundary but sits above the backward: on the boundary micro-step it
# clips the first K-1 micro-batches' gradient, then the last one is added unclipped.
import torch
import torch.nn.functional as F

K = 4


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % K == 0
        if last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # expect: AG311
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        if last:
            opt.step()
            opt.zero_grad()
