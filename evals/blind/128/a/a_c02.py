"""DDP trainer class with ragged ranks: rank 0 reads micro-batches of 3 rows, rank 1
of 5 rows. Each window's loss is a per-row sum normalised by the window's row count
over all ranks (x world, since DDP averages), so every row weighs the same. Epochs of
8 micro-batches with K = 3 give 3-3-2 windows, each over its own count. Body on AdamW,
head on SGD with momentum; gradient_as_bucket_view; a DataLoader worker.
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Settings:
    K = 3
    micro_per_epoch = 8
    epochs = 3
    rows_by_rank = (3, 5)
    d_in = 10
    classes = 4
    seed = 31337


class RaggedShard(Dataset):
    """Micro-batch-level dataset: item i is a whole micro-batch for this rank."""

    def __init__(self, rank, s: Settings):
        g = torch.Generator().manual_seed(s.seed + 101 * rank)
        rows = s.rows_by_rank[rank]
        self.x = torch.randn(s.micro_per_epoch, rows, s.d_in, generator=g)
        w = torch.linspace(-1, 1, s.d_in * s.classes).view(s.d_in, s.classes)
        self.y = (self.x @ w + 0.3 * torch.randn(s.micro_per_epoch, rows, s.classes, generator=g)).argmax(-1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, s: Settings):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(s.d_in, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, s.classes)

    def forward(self, x):
        return self.head(self.body(x))


class RaggedTrainer:
    def __init__(self, s: Settings):
        self.s = s
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(s.seed)
        net = Net(s)
        self.ddp = DDP(net, gradient_as_bucket_view=True)
        self.opt_body = torch.optim.AdamW(net.body.parameters(), lr=5e-3, weight_decay=0.01)
        self.opt_head = torch.optim.SGD(net.head.parameters(), lr=0.1, momentum=0.9)
        self.loader = DataLoader(RaggedShard(self.rank, s), batch_size=None, shuffle=False,
                                 num_workers=1, persistent_workers=True)

    def windows(self):
        buf = []
        for mb in self.loader:
            buf.append(mb)
            if len(buf) == self.s.K:
                yield buf
                buf = []
        if buf:
            yield buf

    def window_rows(self, window):
        n = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
        dist.all_reduce(n, op=dist.ReduceOp.SUM)
        return n

    def step_window(self, window):
        denom = self.window_rows(window)
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            with (nullcontext() if last else self.ddp.no_sync()):
                loss_sum = F.cross_entropy(self.ddp(x), y, reduction="sum")
                (loss_sum * self.world / denom).backward()
        for opt in (self.opt_body, self.opt_head):
            opt.step()
            opt.zero_grad(set_to_none=True)

    def fit(self):
        steps = 0
        for _ in range(self.s.epochs):
            for window in self.windows():
                self.step_window(window)
                steps += 1
        return steps

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    tr = RaggedTrainer(Settings())
    steps = tr.fit()
    digest = tr.sha()
    if dist.get_rank() == 0:
        print(f"optimizer steps {steps}", flush=True)
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
