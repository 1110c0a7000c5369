# corpus: style=torch_distributed class=OK
import torch.distributed as dist

world = dist.get_world_size()
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad.data)
        p.grad.data /= world
    optimizer.step()
