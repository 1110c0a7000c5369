"""FSDP2 (fully_shard) on two spawned CPU ranks.

* nested units: every residual block is its own FSDP unit, the root holds the rest
* micro-batches have different sizes, the loss is a sample sum over the window's
  all-ranks sample count (x world size, because FSDP2 averages over ranks)
* gradient reduction is deferred with set_requires_gradient_sync until the last micro-batch
* each epoch has 10 micro-batches per rank and K = 4: windows of 4, 4 and a short one of 2
* clip_grad_norm_ over the DTensor gradients at 0.3 (it acts)
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

PORT = 47108
WORLD = 2
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 2
SEED = 2024
IN, HID, OUT = 12, 48, 3


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, HID)
        self.blocks = nn.ModuleList([Block(HID) for _ in range(3)])
        self.out = nn.Linear(HID, OUT)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def rank_data(rank):
    g = torch.Generator().manual_seed(SEED + rank)
    w = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(SEED))
    out = []
    for _ in range(EPOCHS * MICRO_PER_EPOCH):
        n = int(torch.randint(2, 9, (1,), generator=g))
        x = torch.randn(n, IN, generator=g)
        y = x @ w + 0.05 * torch.randn(n, OUT, generator=g)
        out.append((x, y))
    return out


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(SEED)
    model = Net()
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    data = rank_data(rank)

    for epoch in range(EPOCHS):
        epoch_data = data[epoch * MICRO_PER_EPOCH:(epoch + 1) * MICRO_PER_EPOCH]
        for start in range(0, MICRO_PER_EPOCH, K):
            window = epoch_data[start:start + K]  # the last one is short
            count = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
            dist.all_reduce(count)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                loss = ((model(x) - y) ** 2).sum() * WORLD / count
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
            opt.step()
            opt.zero_grad()

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
