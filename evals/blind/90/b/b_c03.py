# DDP with gradient_as_bucket_view=True, two optimizers (SGD for the embedding table, AdamW
# for the rest) and a frozen projection, data from a DataLoader with a worker.
# Ranks draw micro-batches of different sizes (4 on rank 0, 6 on rank 1); the loss
# is a per-sample sum over the window's all-ranks sample count times W, so DDP's
# average gives the large-batch mean. no_sync() spans forward and backward of the
# first K-1 micro-batches.
import contextlib
import hashlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

K, STEPS = 3, 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(30, 12)
        self.proj = nn.Linear(12, 24)
        self.proj.requires_grad_(False)
        self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 1))

    def forward(self, idx):
        return self.mlp(self.proj(self.table(idx).mean(1))).squeeze(-1)


def loader_for(rank):
    bs = 4 if rank == 0 else 6
    g = torch.Generator().manual_seed(500 + rank)
    n = K * STEPS * bs
    X = torch.randint(0, 30, (n, 5), generator=g)
    Y = X.float().mean(1) / 10.0 + 0.1 * torch.randn(n, generator=g)
    return DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False, num_workers=1), bs


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Model(), gradient_as_bucket_view=True)
    emb_opt = torch.optim.SGD(model.module.table.parameters(), lr=0.5)
    body_opt = torch.optim.AdamW(model.module.mlp.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.StepLR(body_opt, step_size=3, gamma=0.5)
    opts = (emb_opt, body_opt)

    loader, bs = loader_for(rank)
    n_win = torch.tensor(float(bs * K))
    dist.all_reduce(n_win)  # every window holds the same sample count on each rank

    for i, (xb, yb) in enumerate(loader):
        last = (i + 1) % K == 0
        ctx = contextlib.nullcontext() if last else model.no_sync()
        with ctx:
            loss = nn.functional.mse_loss(model(xb), yb, reduction="sum") * world / n_win
            loss.backward()
        if last:
            for o in opts:
                o.step()
            sched.step()
            for o in opts:
                o.zero_grad(set_to_none=False)  # keep the bucket views

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
