"""DDP + ZeroRedundancyOptimizer on heterogeneous workers.

Rank 0 runs micro-batches of 3 samples, rank 1 of 5 (the second box has more
memory), each fed by its own DataLoader worker process. The per-sample loss is
summed and divided by the number of samples of the whole window on all ranks
(times the world size, since DDP averages). The trunk is stepped by a sharded
AdamW, the head by a plain SGD with momentum; a fixed random-feature layer is
frozen. Clipping acts on the full, synchronised gradients at the boundary.
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

K, STEPS, SEED = 3, 10, 31
BS_BY_RANK = {0: 3, 1: 5}


class Points(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 12, generator=g)
        self.y = torch.sin(self.x[:, :3].sum(1, keepdim=True)) + 0.3 * self.x[:, 3:4] ** 2

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rff = nn.Linear(12, 64)          # random Fourier features, frozen
        self.rff.requires_grad_(False)
        self.trunk = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.trunk(torch.cos(self.rff(x))))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    net = Net()
    model = DDP(net)
    trunk_opt = ZeroRedundancyOptimizer(list(net.trunk.parameters()), optimizer_class=torch.optim.AdamW,
                                        lr=3e-3, weight_decay=0.01)
    head_opt = torch.optim.SGD(net.head.parameters(), lr=5e-2, momentum=0.9)

    bs = BS_BY_RANK[rank]
    ds = Points(bs * K * STEPS, seed=SEED + 100 * rank)
    loader = DataLoader(ds, batch_size=bs, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(SEED + rank), persistent_workers=False)
    it = iter(loader)

    for step in range(STEPS):
        window = [next(it) for _ in range(K)]
        count = torch.tensor([sum(x.shape[0] for x, _ in window)], dtype=torch.float32)
        dist.all_reduce(count)
        for j, (x, y) in enumerate(window):
            ctx = model.no_sync() if j < K - 1 else nullcontext()
            with ctx:
                err = (model(x) - y).pow(2).sum()
                (err * world / count).backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        trunk_opt.step()
        head_opt.step()
        trunk_opt.zero_grad(set_to_none=True)
        head_opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} samples {int(count.item())} gnorm {gnorm:.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
