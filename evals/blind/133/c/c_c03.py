"""Self-spawned 2-rank DDP (gloo) hand loop: a small MLP regressor with a learned
embedding table, two optimizers (SGD+momentum for the table, AdamW for the rest),
K = 4 over epochs of 10 micro-batches, so each epoch ends on a 2-micro-batch window.
A window's loss is the mean over the micro-batches it actually holds.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49209
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 3
MB = 6


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(20, 8)
        self.body = nn.Sequential(nn.Linear(8 + 4, 32), nn.SiLU(), nn.Linear(32, 1))

    def forward(self, ids, feats):
        return self.body(torch.cat([self.table(ids), feats], -1)).squeeze(-1)


def windows(n, k):
    starts = range(0, n, k)
    return [list(range(s, min(s + k, n))) for s in starts]


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = Net()
    model = DDP(net)
    opt_table = torch.optim.SGD(net.table.parameters(), lr=0.5, momentum=0.9)
    opt_body = torch.optim.AdamW(net.body.parameters(), lr=5e-3)

    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, 20, (MICRO_PER_EPOCH, MB), generator=g)
    feats = torch.randn(MICRO_PER_EPOCH, MB, 4, generator=g)
    target = torch.sin(ids.float()) + feats.sum(-1) * 0.3

    steps = 0
    for epoch in range(EPOCHS):
        order = torch.randperm(MICRO_PER_EPOCH, generator=g)
        for win in windows(MICRO_PER_EPOCH, K):
            for j, i in enumerate(win):
                last = j == len(win) - 1
                b = order[i]
                if last:
                    loss = F.mse_loss(model(ids[b], feats[b]), target[b]) / len(win)
                    loss.backward()
                else:
                    with model.no_sync():
                        loss = F.mse_loss(model(ids[b], feats[b]), target[b]) / len(win)
                        loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt_table.step()
            opt_body.step()
            opt_table.zero_grad(set_to_none=True)
            opt_body.zero_grad(set_to_none=True)
            steps += 1

    if rank == 0:
        print("optimizer steps:", steps)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in net.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
