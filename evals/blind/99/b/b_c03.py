"""FSDP2 on mp.spawn ranks: nested fully_shard units, bf16 compute over fp32
master parameters with fp32 gradient reduction, gradient sync deferred to the
last micro-batch of each window, micro-batches of 2..8 samples, and a
global-norm clip on the sharded (DTensor) gradients.

Per window: loss = sum of per-sample Huber losses / (all-ranks sample count in
the window) * W, because FSDP2 averages the reduce-scatter over W ranks.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

PORT = 49113
ACCUM = 4
UPDATES = 9
CLIP = 0.25


class Residual(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Forecaster(nn.Module):
    def __init__(self, d_in=10, d=40, depth=3):
        super().__init__()
        self.proj = nn.Linear(d_in, d)
        self.layers = nn.ModuleList([Residual(d) for _ in range(depth)])
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        h = self.proj(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def make_windows(rank):
    g = torch.Generator().manual_seed(555 + rank)
    wins = []
    for _ in range(UPDATES):
        win = []
        for _ in range(ACCUM):
            n = int(torch.randint(2, 9, (1,), generator=g))
            x = torch.randn(n, 10, generator=g)
            y = torch.stack([x[:, :5].sum(1), x[:, 5:].prod(1)], 1)
            win.append((x, y))
        wins.append(win)
    return wins


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Forecaster()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    for u, win in enumerate(make_windows(rank)):
        count = torch.tensor(float(sum(x.shape[0] for x, _ in win)))
        dist.all_reduce(count)
        for i, (x, y) in enumerate(win):
            model.set_requires_gradient_sync(i == len(win) - 1)
            pred = model(x).float()
            loss = F.huber_loss(pred, y, reduction="sum", delta=1.0)
            (loss * world / count).backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        if rank == 0 and u % 3 == 2:
            print(f"update {u + 1} grad-norm {gnorm.full_tensor().item() if hasattr(gnorm, 'full_tensor') else float(gnorm):.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor()
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
