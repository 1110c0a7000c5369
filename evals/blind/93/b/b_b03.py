"""Image-ish classifier on spawned DDP ranks with a sharded optimizer state
(ZeroRedundancyOptimizer) and a one-cycle learning-rate policy.

Launch: python b_b03.py   (spawns its own 2 ranks)
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD = 2
PORT = 46105
HP = dict(batch_size=4, accum_steps=4, epochs=3, max_lr=5e-3, n_samples=128, seed=2024)


class SmallConvNet(nn.Module):
    def __init__(self, n_cls=5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, n_cls)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 16, 16, generator=g)
    y = (x.mean(dim=(1, 2, 3)) * 7).floor().long().clamp(-2, 2) + 2
    return TensorDataset(x, y)


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(HP["seed"])

    model = DDP(SmallConvNet())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=HP["max_lr"], weight_decay=0.0)
    ds = make_dataset(HP["n_samples"], HP["seed"] + 1)
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=HP["seed"])
    loader = DataLoader(ds, batch_size=HP["batch_size"], sampler=sampler)
    K = HP["accum_steps"]
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=HP["max_lr"], epochs=HP["epochs"], steps_per_epoch=len(loader),
        cycle_momentum=False)

    for epoch in range(HP["epochs"]):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            boundary = (i + 1) % K == 0
            ctx = contextlib.nullcontext() if boundary else model.no_sync()
            with ctx:
                loss = F.cross_entropy(model(xb), yb) / K
                loss.backward()
            if boundary:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)

    if rank == 0:
        params = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        if os.environ.get("PARAM_DUMP"):
            torch.save(params, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for t in params.values():
            h.update(t.float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
