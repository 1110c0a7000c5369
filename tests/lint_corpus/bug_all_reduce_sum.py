# corpus: style=torch_distributed class=F10
# hand-rolled data parallelism with accumulation
import torch.distributed as dist


def train(model, optimizer, loader, accum_steps):
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # expect: AG107
            optimizer.step()
            optimizer.zero_grad()
