"""FSDP2 regressor with nested fully_shard units, deferred gradient sync, variable-size
micro-batches, a short last window and a gradient-norm clip/monitor after every backward.

Launch: torchrun --nproc-per-node 2 ... b_c02.py
"""
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SEED = 11
ACCUM = 4
MICRO_PER_EPOCH = 10      # windows of 4, 4, 2
EPOCHS = 3
MAX_NORM = 0.3


class Stage(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Model(nn.Module):
    def __init__(self, d=20):
        super().__init__()
        self.stem = nn.Linear(8, d)
        self.stages = nn.Sequential(Stage(d), Stage(d))
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


def make_epoch(epoch, rank, world):
    g = torch.Generator().manual_seed(SEED * 100 + epoch)
    out = []
    for i in range(MICRO_PER_EPOCH):
        per_rank = []
        for r in range(world):
            n = int(torch.randint(2, 9, (1,), generator=g))
            x = torch.randn(n, 8, generator=g)
            y = torch.stack([x[:, :4].sum(1), x[:, 4:].prod(1)], 1)
            per_rank.append((x, y))
        out.append(per_rank[rank])
    return out


class GradMonitor:
    """Clips and records the total norm after each backward (for the dashboards)."""

    def __init__(self, params, max_norm):
        self.params = list(params)
        self.max_norm = max_norm
        self.history = []

    def __call__(self):
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.history.append(float(norm))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(SEED)
    model = Model()
    for st in model.stages:
        fully_shard(st, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
    monitor = GradMonitor(model.parameters(), MAX_NORM)

    for epoch in range(EPOCHS):
        batches = make_epoch(epoch, rank, world)
        n_windows = math.ceil(len(batches) / ACCUM)
        for w in range(n_windows):
            window = batches[w * ACCUM:(w + 1) * ACCUM]
            count = torch.tensor([sum(x.shape[0] for x, _ in window)], dtype=torch.float64)
            dist.all_reduce(count)  # samples in this window over all ranks
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                # sum of squared errors over the window's global count; x W undoes the
                # reduce-scatter's average over ranks
                loss = F.mse_loss(model(x), y, reduction="sum") * world / count.item()
                loss.backward()
                monitor()
            opt.step()
            opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
