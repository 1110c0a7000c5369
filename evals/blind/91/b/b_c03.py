"""DDP + ZeroRedundancyOptimizer regression with ragged micro-batches from a worker
DataLoader. Each window is read ahead so the loss can be normalised by the window's sample
count over all ranks (x world size, since DDP averages); the epoch ends on a 1-batch window."""
import hashlib
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

ACCUM = 3
EPOCHS = 2
SIZES = {0: [3, 5, 2, 4, 6, 3, 2], 1: [4, 2, 5, 3, 2, 6, 5]}  # 7 micro-batches: 3 + 3 + 1


class Points(Dataset):
    def __init__(self, rank, n):
        g = torch.Generator().manual_seed(50 + rank)
        self.x = torch.randn(n, 10, generator=g)
        w = torch.randn(10, 3, generator=torch.Generator().manual_seed(9))
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(n, 3, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class RaggedBatches:
    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        start = 0
        for s in self.sizes:
            yield list(range(start, start + s))
            start += s

    def __len__(self):
        return len(self.sizes)


def take_windows(loader, k):
    it = iter(loader)
    while True:
        win = list(itertools.islice(it, k))
        if not win:
            return
        yield win


def sha_params(named):
    h = hashlib.sha256()
    for _, p in named:
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(21)
    net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                        nn.Linear(32, 3))
    model = DDP(net)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=5e-3, weight_decay=0.01)
    ds = Points(rank, sum(SIZES[rank]))
    loader = DataLoader(ds, batch_sampler=RaggedBatches(SIZES[rank]), num_workers=1)

    for epoch in range(EPOCHS):
        for win in take_windows(loader, ACCUM):
            count = torch.tensor(float(sum(len(x) for x, _ in win)))
            dist.all_reduce(count)
            for j, (x, y) in enumerate(win):
                sync = j == len(win) - 1
                model.require_backward_grad_sync = sync
                per_sample = ((model(x) - y) ** 2).sum(-1)
                (per_sample.sum() * world / count).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    sha = sha_params(net.named_parameters())
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
