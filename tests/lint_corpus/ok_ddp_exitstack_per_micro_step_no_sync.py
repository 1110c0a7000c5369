# corpus: style=ddp class=OK
# An ExitStack per micro-step: the no_sync() entered for micro-steps 1..K-1 closes with each,
# and the window's last backward runs with DDP's reduction on.
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4


def train(net, batches, steps):
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        for k in range(K):
            with contextlib.ExitStack() as stack:
                if k < K - 1:
                    stack.enter_context(model.no_sync())
                x, y = batches[step * K + k]
                (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
