# corpus: style=ddp class=OK
# the sync flag is named for the window's last micro-step (`k == K - 1`, the last pass of
# `for k in range(K)`) and set before the forward, so the last backward all-reduces
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(net, opt, stream, steps, K=4):
    model = DDP(net)
    for step in range(steps):
        for k in range(K):
            x, y = next(stream)
            model.require_backward_grad_sync = k == K - 1
            logits = model(x)
            torch.nn.functional.cross_entropy(logits, y).div(K).backward()
        opt.step()
        opt.zero_grad()
