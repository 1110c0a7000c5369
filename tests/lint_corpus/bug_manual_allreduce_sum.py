# corpus: style=torch_distributed class=F10
import torch.distributed as dist

for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # expect: AG107
    optimizer.step()
