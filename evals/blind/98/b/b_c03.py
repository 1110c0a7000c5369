"""DDP trainer over uneven micro-batches (3..9 samples, different per rank),
with gradients as bucket views, a worker DataLoader fed by a per-rank batch sampler, two
optimizers (AdamW for the trunk, SGD-momentum for the head), a global-norm
clip that acts, and a sample-sum loss normalised by the window's all-ranks
sample count (x world size, since DDP averages)."""
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 3
STEPS = 9
SEED = 21


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 40), nn.SiLU(), nn.Linear(40, 40), nn.SiLU())
        self.head = nn.Linear(40, 5)

    def forward(self, x):
        return self.head(self.trunk(x))


def rank_batches(rank, world):
    g = torch.Generator().manual_seed(SEED + 7)
    sizes = torch.randint(3, 10, (world, STEPS * ACCUM), generator=g)
    total = int(sizes.sum())
    x = torch.randn(total, 12, generator=g)
    y = (x[:, :5] + 0.3 * torch.randn(total, 5, generator=g)).argmax(-1)
    # carve the sample stream into micro-batches: rank r takes column r
    idx, start = [[] for _ in range(world)], 0
    for j in range(STEPS * ACCUM):
        for r in range(world):
            n = int(sizes[r, j])
            idx[r].append(list(range(start, start + n)))
            start += n
    return TensorDataset(x, y), idx[rank]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    net = Net()
    model = DDP(net, gradient_as_bucket_view=True, broadcast_buffers=False)
    opt_trunk = torch.optim.AdamW(net.trunk.parameters(), lr=2e-3, weight_decay=0.02)
    opt_head = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    optimizers = (opt_trunk, opt_head)

    ds, batches = rank_batches(rank, world)
    loader = DataLoader(ds, batch_sampler=batches, num_workers=1)
    it = iter(loader)

    for step in range(STEPS):
        window = [next(it) for _ in range(ACCUM)]
        count = torch.tensor([sum(len(y) for _, y in window)], dtype=torch.float64)
        dist.all_reduce(count)
        for i, (x, y) in enumerate(window):
            sync = i == len(window) - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                loss = F.cross_entropy(model(x), y, reduction="sum") * world / count.item()
                loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=0.15)
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} window samples {int(count.item())} gnorm {gnorm.item():.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in net.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
