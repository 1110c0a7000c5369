# corpus: style=plain class=F10
# one flat all-reduce, then a loop that rebinds its own variable instead of copying back
import torch
import torch.distributed as dist


def average(params):
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g = part  # expect: AG195


def train(model, opt, loader, k=2):
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.mse_loss(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            average(list(model.parameters()))
            opt.step()
            opt.zero_grad()
