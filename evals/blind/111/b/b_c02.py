"""Churn classifier with hand-written FSDP2 (fully_shard) on 2 spawned ranks.

* body trained by AdamW, head by SGD with momentum (two optimizers, one clip)
* each epoch has 10 micro-batches per rank and K = 4, so the windows are
  4, 4, 2: the short tail window is averaged over its own 2 micro-batches and
  still stepped at the end of the epoch
* gradient sync is deferred to the last micro-batch of each window
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

WORLD = 2
PORT = 49110
K = 4
MICRO_PER_EPOCH = 10
BS = 6
EPOCHS = 2
FEATS = 20
CLASSES = 3
CLIP = 0.15


class Churn(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.ModuleList([nn.Sequential(nn.Linear(FEATS if i == 0 else 48, 48), nn.ReLU()) for i in range(3)])
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x):
        for layer in self.body:
            x = layer(x)
        return self.head(x)


def rank_shard(rank):
    g = torch.Generator().manual_seed(500 + rank)
    n = MICRO_PER_EPOCH * BS
    x = torch.randn(n, FEATS, generator=g)
    w = torch.randn(FEATS, CLASSES, generator=torch.Generator().manual_seed(3))
    y = (x @ w + 0.5 * torch.randn(n, CLASSES, generator=g)).argmax(dim=1)
    return x, y


def windows(n_micro, k):
    out, cur = [], []
    for i in range(n_micro):
        cur.append(i)
        if len(cur) == k or i == n_micro - 1:
            out.append(cur)
            cur = []
    return out


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    model = Churn()
    for layer in model.body:
        fully_shard(layer)
    fully_shard(model)

    opt_body = torch.optim.AdamW(model.body.parameters(), lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=5e-2, momentum=0.9)
    x, y = rank_shard(rank)

    for epoch in range(EPOCHS):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch * 10 + rank))
        for win in windows(MICRO_PER_EPOCH, K):
            for j, m in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                idx = perm[m * BS:(m + 1) * BS]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                (loss / len(win)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad(set_to_none=True)
            opt_head.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor()
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
