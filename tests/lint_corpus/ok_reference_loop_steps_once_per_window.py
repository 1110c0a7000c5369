# corpus: style=ddp_reference class=OK
import contextlib

import torch
import torch.nn.functional as F


def windows(loader, k):
    batch = []
    for b in loader:
        batch.append(b)
        if len(batch) == k:
            yield batch
            batch = []


def train(model, ddp_model, loader, opt, grad_accum):
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % grad_accum == 0
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            (F.cross_entropy(ddp_model(x), y) / grad_accum).backward()
        if last:
            opt.step()
            opt.zero_grad()


def reference(ref, loader, grad_accum, bs):
    r_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for win in windows(loader, grad_accum):
        x = torch.cat([b[0] for b in win])
        y = torch.cat([b[1] for b in win])
        F.cross_entropy(ref(x), y).backward()
        r_opt.step()
        r_opt.zero_grad()


def reference_by_slices(ref, xs, ys, grad_accum, bs, steps):
    r_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    win = bs * grad_accum
    for s in range(steps):
        r_opt.zero_grad()
        F.cross_entropy(ref(xs[s * win:(s + 1) * win]), ys[s * win:(s + 1) * win]).backward()
        r_opt.step()
