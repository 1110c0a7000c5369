"""Small conv audio classifier on DDP, trainer class with activation checkpointing,
a DataLoader with a worker process, and a norm clip that acts at each window's boundary.

Each rank's shard has 22 samples, micro-batches of 4 (the last one has 2), K = 3:
windows of 3-3 micro-batches per epoch with the 2-sample micro-batch inside the second
window; the loss is a per-sample sum over the window's all-ranks sample count times W.
"""
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset


class Clips(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 1, 64, generator=g)
        self.y = (self.x[:, 0, :8].sum(-1) > 0).long() + (self.x[:, 0, 8:16].sum(-1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv1d(1, 16, 5, padding=2)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv1d(16, 16, 3, padding=1), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = F.relu(self.stem(x))
        for b in self.blocks:
            h = h + checkpoint(b, h, use_reentrant=False)
        return self.head(h.mean(-1))


class ClipTrainer:
    K = 3
    EPOCHS = 3
    MAX_NORM = 0.2

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(11)
        self.model = DDP(ConvNet())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=2e-3)
        full = Clips(44, seed=3)
        idx = list(range(self.rank, len(full), self.world))
        self.loader = DataLoader(torch.utils.data.Subset(full, idx), batch_size=4, shuffle=False,
                                 num_workers=1, persistent_workers=True)
        self.clipped = 0

    def run_window(self, window):
        n = torch.tensor(float(sum(len(y) for _, y in window)))
        dist.all_reduce(n)
        for j, (x, y) in enumerate(window):
            ctx = self.model.no_sync() if j < len(window) - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(self.model(x), y, reduction="sum") * self.world / n
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.MAX_NORM)
        self.clipped += int(norm > self.MAX_NORM)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.EPOCHS):
            window = []
            for batch in self.loader:
                window.append(batch)
                if len(window) == self.K:
                    self.run_window(window)
                    window = []
            if window:
                self.run_window(window)
        if self.rank == 0:
            print(f"windows clipped: {self.clipped}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    t = ClipTrainer()
    t.fit()
    d = t.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
