"""Metric regression on 2 DDP ranks with a summing comm hook and a sharded
optimizer (ZeroRedundancyOptimizer).

Rank 0 reads micro-batches of 5 samples and rank 1 of 3 (different shards of a feature
store). The comm hook SUMS the gradients (no / world size), so each rank's loss is its sample
sum divided by the window's sample count over all ranks. no_sync on the first K-1
micro-batches, gradients as bucket views.
"""
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

K, UPDATES, SEED = 3, 8, 21
BS_PER_RANK = {0: 5, 1: 3}


def allreduce_sum_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def window_batches(rank, update):
    g = torch.Generator().manual_seed(SEED * 7919 + update * 13 + rank)
    bs = BS_PER_RANK[rank]
    out = []
    for _ in range(K):
        x = torch.randn(bs, 16, generator=g)
        y = x[:, :4].sum(1, keepdim=True) - x[:, 4:8].prod(1, keepdim=True)
        out.append((x, y))
    return out


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    net = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 1))
    model = DDP(net, gradient_as_bucket_view=True)
    model.register_comm_hook(state=None, hook=allreduce_sum_hook)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=5e-3)

    for update in range(UPDATES):
        window = window_batches(rank, update)
        n = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
        dist.all_reduce(n)  # 24 samples per window over both ranks
        for j, (x, y) in enumerate(window):
            ctx = model.no_sync() if j < K - 1 else contextlib.nullcontext()
            with ctx:
                loss = nn.functional.smooth_l1_loss(model(x), y, reduction="sum") / n
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
