# corpus: style=hand_ddp class=F7
# data parallelism by hand stepping the epoch's short last window too, but dividing the
# summed gradient by a full window's size every time: that window's update is r/K of its mean
import torch
import torch.distributed as dist


def reduce_and_scale(model, denom):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= denom
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def train(model, loader, micro_bs=8, accum=4):
    world = dist.get_world_size()
    window_size = world * micro_bs * accum
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = len(loader)
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        if (i + 1) % accum == 0 or i + 1 == n:
            reduce_and_scale(model, window_size)  # expect: AG141
            opt.step()
            opt.zero_grad()
