"""FSDP2 on spawned ranks: bf16 compute with fp32 gradient reduction, two optimizers
(AdamW for the trunk, SGD with momentum for the head), micro-batches of uneven size,
10 micro-batches per epoch with K = 4 (windows of 4, 4 and 2), the loss summed per
sample and normalised by the window's all-ranks sample count (x W to undo FSDP's
average), one global-norm clip over both optimizers' sharded gradients.

python b_c01.py [port]
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 49131
K = 4
BATCHES_PER_EPOCH = 10
EPOCHS = 3
CLIP = 0.8
SEED = 99


def micro_size(epoch, i, rank):
    return 2 + (epoch * 5 + i * 3 + rank * 4) % 6   # 2..7 samples


def make_epoch(epoch, rank):
    out = []
    for i in range(BATCHES_PER_EPOCH):
        g = torch.Generator().manual_seed(SEED * 10007 + epoch * 101 + i * 7 + rank)
        n = micro_size(epoch, i, rank)
        x = torch.randn(n, 10, generator=g)
        y = (x[:, :5].sum(1, keepdim=True) > 0).float() * x[:, 5:7] + 0.1 * torch.randn(n, 2, generator=g)
        out.append((x, y))
    return out


class Trunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(10, 64)
        self.l2 = nn.Linear(64, 64)

    def forward(self, x):
        return F.silu(self.l2(F.silu(self.l1(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = Trunk()
        self.head = nn.Linear(64, 2)

    def forward(self, x):
        return self.head(self.trunk(x))


def windows(n, k):
    starts = list(range(0, n, k))
    return [list(range(s, min(s + k, n))) for s in starts]


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(SEED)
    model = Model()
    pol = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(model.trunk, mp_policy=pol)
    fully_shard(model.head, mp_policy=pol)
    fully_shard(model, mp_policy=pol)
    opt_trunk = torch.optim.AdamW(model.trunk.parameters(), lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=2e-2, momentum=0.9)
    optimizers = (opt_trunk, opt_head)

    for epoch in range(EPOCHS):
        data = make_epoch(epoch, rank)
        for win in windows(len(data), K):
            count = torch.tensor(float(sum(data[i][0].shape[0] for i in win)))
            dist.all_reduce(count)
            for j, i in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                x, y = data[i]
                err = F.mse_loss(model(x).float(), y, reduction="none").sum(1)
                (err.sum() * world / count).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            for o in optimizers:
                o.step()
            for o in optimizers:
                o.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
