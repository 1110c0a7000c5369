"""FSDP2 on spawned ranks over micro-batches of uneven sizes; each epoch ends in
a short window (10 micro-batches per rank, K = 4). The objective of a window is
the mean over all of its samples on all ranks; FSDP2 averages over ranks, so
each sample's loss is scaled by W / (window samples, all ranks). A frozen
positional table and a global-norm clip on the sharded gradients."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

WORLD, PORT, K, EPOCHS, PER_EPOCH = 2, 40151, 4, 2, 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(6, 24) * 0.1, requires_grad=False)
        self.inp = nn.Linear(12, 24)
        self.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(24), nn.Linear(24, 24), nn.GELU())
                                     for _ in range(2)])
        self.cls = nn.Linear(24, 5)

    def forward(self, x):  # x: (B, 6, 12)
        h = self.inp(x) + self.pos
        for l in self.layers:
            h = h + l(h)
        return self.cls(h.mean(1))


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(100 * epoch + rank)
    out = []
    for i in range(PER_EPOCH):
        b = int(torch.randint(2, 8, (1,), generator=g))
        x = torch.randn(b, 6, 12, generator=g)
        out.append((x, (x.sum((1, 2)) > 0).long() + 2 * (x[:, 0, 0] > 0.5).long()))
    return out


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = Net()
    for l in model.layers:
        fully_shard(l)
    fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3)

    step = 0
    for epoch in range(EPOCHS):
        data = epoch_batches(rank, epoch)
        for w0 in range(0, PER_EPOCH, K):
            window = data[w0:w0 + K]
            n = torch.tensor(float(sum(len(y) for _, y in window)))
            dist.all_reduce(n)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                loss = F.cross_entropy(model(x), y, reduction="sum") * WORLD / n
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.3)
            opt.step()
            opt.zero_grad()
            step += 1
            if rank == 0:
                print(f"epoch {epoch} step {step} window {len(window)} norm {float(norm.full_tensor()):.3f}", flush=True)

    fulls = [(n, p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in model.named_parameters()]
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
