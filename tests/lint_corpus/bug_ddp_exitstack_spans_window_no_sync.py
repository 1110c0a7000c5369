# corpus: style=ddp class=F11
# One ExitStack around the whole window: the no_sync() entered for the first micro-steps stays
# open through the last one, so DDP never reduces and each rank steps on its own gradient.
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4


def train(net, batches, steps):
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        with contextlib.ExitStack() as stack:
            for k in range(K):
                if k < K - 1:
                    stack.enter_context(model.no_sync())  # expect: AG111
                x, y = batches[step * K + k]
                (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
