"""FSDP2 (fully_shard) trainer with ragged micro-batches and windows of 3, 3 and 2 micro-batches.

Each window's loss is a per-sample sum over the window's all-ranks sample count; FSDP2 averages
gradients over ranks, so the sum is multiplied by the world size. Nesterov SGD with a norm clip.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

SEED = 3
WINDOWS = [3, 3, 2] * 3  # micro-batches per optimizer step; 9 steps
CLIP = 0.5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 32)
        self.hidden = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.SiLU())
        self.cls = nn.Linear(32, 4)

    def forward(self, x):
        return self.cls(self.hidden(torch.relu(self.inp(x))))


class Trainer:
    def __init__(self):
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(SEED)
        net = Net()
        fully_shard(net.hidden)
        self.model = fully_shard(net)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        g = torch.Generator().manual_seed(SEED + 10 * self.rank)
        n_micro = sum(WINDOWS)
        # rank 0 sees 3 samples per micro-batch, rank 1 sees 5..6 (ragged)
        sizes = [3] * n_micro if self.rank == 0 else [5 + (i % 2) for i in range(n_micro)]
        self.micro = [(torch.randn(s, 12, generator=g), torch.randint(0, 4, (s,), generator=g)) for s in sizes]

    def window_count(self, window):
        n = torch.tensor([float(sum(len(y) for _, y in window))])
        dist.all_reduce(n)
        return n.item()

    def run_window(self, window):
        total = self.window_count(window)
        for j, (x, y) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            loss = nn.functional.cross_entropy(self.model(x), y, reduction="sum") * self.world / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        self.opt.zero_grad()

    def fit(self):
        pos = 0
        for k in WINDOWS:
            self.run_window(self.micro[pos:pos + k])
            pos += k

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = Trainer()
    t.fit()
    d = t.digest()
    if t.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()
