# corpus: style=hand_ddp class=OK
# the same loop dividing by the samples the window actually had, summed over the ranks
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


def train(model, loader, accum=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = len(loader)
    seen = 0
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        seen += x.shape[0]
        if (i + 1) % accum == 0 or i + 1 == n:
            count = torch.tensor(float(seen))
            dist.all_reduce(count)
            reduce_and_scale(model, count)
            opt.step()
            opt.zero_grad()
            seen = 0
