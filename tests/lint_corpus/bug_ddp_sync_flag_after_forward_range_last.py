# corpus: style=ddp class=F11
# the sync flag is named for the window's last micro-step (`k == K - 1`, the last pass of
# `for k in range(K)`), but it is set after the forward: the last forward saw k = K - 2's False
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(net, opt, stream, steps, K=4):
    model = DDP(net)
    for step in range(steps):
        for k in range(K):
            x, y = next(stream)
            logits = model(x)
            model.require_backward_grad_sync = k == K - 1  # expect: AG106
            torch.nn.functional.cross_entropy(logits, y).div(K).backward()
        opt.step()
        opt.zero_grad()
