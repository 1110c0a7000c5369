# corpus: style=ddp class=OK
# The loss over the window's token count summed over every rank, DDP's average, then a hand
# SUM of the gradients: W x DDP's average is the sum over ranks, the large batch's mean.
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4


def train(net, windows, steps):
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for window in windows[:steps]:
        n_tok = torch.tensor(float(sum(int(m.sum()) for _, _, m in window)))
        dist.all_reduce(n_tok)
        for i, (x, y, m) in enumerate(window):
            with model.no_sync() if i < K - 1 else contextlib.nullcontext():
                per_tok = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
                loss = (per_tok * m).sum() / n_tok
                loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # expect: AG108
        opt.step()
        opt.zero_grad()
