# corpus: style=plain class=OK
# the reduced clone is copied back into .grad
import torch
import torch.distributed as dist


def sync_grads(model):
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().clone()
        dist.all_reduce(g)
        p.grad.copy_(g / world)


def train(model, opt, loader, accum=2):
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.mse_loss(model(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            sync_grads(model)
            opt.step()
            opt.zero_grad()
