# corpus: style=torch_distributed class=OK
import torch.distributed as dist


def sync_grads(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world_size


def train(model, optimizer, loader, accum_steps):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / accum_steps).backward()
        if (i + 1) % accum_steps == 0:
            sync_grads(model)
            optimizer.step()
            optimizer.zero_grad()
