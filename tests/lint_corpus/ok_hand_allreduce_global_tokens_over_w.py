# corpus: style=ddp class=OK
# gradients averaged over ranks by hand (one flattened buffer, SUM then / W); each rank
# divides its window's token-loss sum by the window's global count over W (all-reduced)
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

W, K, IGNORE = 2, 4, -100


def window_normaliser(window):
    n = torch.tensor(float(sum(int((t != IGNORE).sum()) for _, t in window)))
    dist.all_reduce(n)
    return n / W


def allreduce_grads(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    buf = _flatten_dense_tensors(grads)
    dist.all_reduce(buf)
    buf /= W
    for g, synced in zip(grads, _unflatten_dense_tensors(buf, grads)):
        g.copy_(synced)


def run(rank, model, shard, steps):
    dist.init_process_group("gloo", rank=rank, world_size=W)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        window = shard[step * K:(step + 1) * K]
        denom = window_normaliser(window)
        for ids, tags in window:
            logits = model(ids)
            loss_sum = F.cross_entropy(logits.flatten(0, 1), tags.flatten(),
                                       ignore_index=IGNORE, reduction="sum")
            (loss_sum / denom).backward()
        allreduce_grads(model)
        opt.step()
        opt.zero_grad()
