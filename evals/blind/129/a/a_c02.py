"""FSDP2 regression-to-classes trainer with ragged ranks and ragged windows.

Rank 0 reads 3 rows per micro-batch, rank 1 reads 5. Each epoch has 8 micro-batches
per rank, accumulated in windows of up to K = 3 (so 3-3-2). Each window is read
ahead, its row count summed over ranks, and every row weighted 1 / count; the sum
is multiplied by the world size because FSDP2 averages the reduce-scatter.
Trunk on AdamW, head on SGD with momentum, one global clip across both.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

D_IN, D, N_CLS = 12, 40, 5
ROWS = {0: 3, 1: 5}
MICRO_PER_EPOCH, K, EPOCHS = 8, 3, 3
CLIP = 0.4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(D_IN, D)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU()) for _ in range(2)]
        )
        self.head = nn.Linear(D, N_CLS)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def epoch_batches(x, y, rank):
    per_step = sum(ROWS.values())
    off = sum(ROWS[r] for r in range(rank))
    for j in range(MICRO_PER_EPOCH):
        lo = j * per_step + off
        yield x[lo:lo + ROWS[rank]], y[lo:lo + ROWS[rank]]


def windows(it):
    buf = []
    for b in it:
        buf.append(b)
        if len(buf) == K:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(3)
    model = Net()
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    head_params = list(model.head.parameters())
    head_ids = {id(p) for p in head_params}
    trunk_params = [p for p in model.parameters() if id(p) not in head_ids]
    opt_trunk = torch.optim.AdamW(trunk_params, lr=4e-3, weight_decay=0.02)
    opt_head = torch.optim.SGD(head_params, lr=0.05, momentum=0.9)

    g = torch.Generator().manual_seed(4)
    n = MICRO_PER_EPOCH * sum(ROWS.values())
    x = torch.randn(n, D_IN, generator=g)
    y = (x[:, :N_CLS] * torch.linspace(1, 2, N_CLS)).argmax(-1)

    for epoch in range(EPOCHS):
        for window in windows(epoch_batches(x, y, rank)):
            count = torch.tensor(float(sum(len(b[1]) for b in window)))
            dist.all_reduce(count)
            for i, (xb, yb) in enumerate(window):
                model.set_requires_gradient_sync(i == len(window) - 1)
                loss = F.cross_entropy(model(xb), yb, reduction="sum") * world / count
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt_trunk.step()
            opt_head.step()
            opt_trunk.zero_grad()
            opt_head.zero_grad()

    h = hashlib.sha256()
    flat = []
    for _, p in model.named_parameters():
        t = p.full_tensor().detach().to(torch.float32).contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if rank == 0:
        if args.dump:
            torch.save(torch.cat(flat), args.dump)
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
