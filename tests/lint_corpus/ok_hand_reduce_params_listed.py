# corpus: style=hand_dp class=OK
"""Data parallelism by hand: one coalesced all-reduce per window over the trainable params."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

ACCUM = 2


def average_gradients(model, world):
    trainable = [p for p in model.parameters() if p.requires_grad]
    bufs = [p.grad for p in trainable]
    flat = torch.cat([b.reshape(-1) for b in bufs])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in trainable:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def train(model, batches, world):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches):
        (F.mse_loss(model(x), y) / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            average_gradients(model, world)
            opt.step()
            opt.zero_grad()
