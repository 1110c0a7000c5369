# corpus: style=hand_ddp class=OK
# data parallelism by hand: the gradients are packed and summed over the ranks by a helper
# called only at the window's boundary or the epoch's last batch, then divided by the
# all-reduced sample count of the window
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def sync_grads(model, denom):
    grads = [p.grad for p in model.parameters()]
    buf = _flatten_dense_tensors(grads)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    buf /= denom
    for g, synced in zip(grads, _unflatten_dense_tensors(buf, grads)):
        g.copy_(synced)


def train(model, loader, accum=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = len(loader)
    seen = 0
    for it, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        seen += x.shape[0]
        if (it + 1) % accum == 0 or it + 1 == n:
            count = torch.tensor(float(seen))
            dist.all_reduce(count)
            sync_grads(model, count)
            opt.step()
            opt.zero_grad()
            seen = 0
