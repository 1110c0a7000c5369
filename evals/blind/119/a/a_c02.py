"""FSDP2 classifier trainer: uneven samples per rank, a short last window, two optimizers."""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    feat: int = 24
    hidden: int = 48
    classes: int = 5
    accum: int = 3
    micro_batches: int = 20      # per rank: windows of 3,3,3,3,3,3,2
    lr_body: float = 2e-3
    lr_head: float = 0.05
    max_norm: float = 0.8
    seed: int = 3


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.ModuleList([nn.Sequential(nn.Linear(c.feat if i == 0 else c.hidden, c.hidden), nn.SiLU()) for i in range(2)])
        self.head = nn.Linear(c.hidden, c.classes)

    def forward(self, x):
        for blk in self.body:
            x = blk(x)
        return self.head(x)


class Trainer:
    def __init__(self, c):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        self.model = Net(c)
        for blk in self.model.body:
            fully_shard(blk)
        fully_shard(self.model)
        self.opt_body = torch.optim.AdamW(self.model.body.parameters(), lr=c.lr_body)
        self.opt_head = torch.optim.SGD(self.model.head.parameters(), lr=c.lr_head, momentum=0.9)
        g = torch.Generator().manual_seed(c.seed + 31 * self.rank)
        bs = 6 if self.rank == 0 else 10           # ranks see different micro-batch sizes
        self.batches = [(torch.randn(bs, c.feat, generator=g), torch.randint(0, c.classes, (bs,), generator=g))
                        for _ in range(c.micro_batches)]

    def windows(self):
        K = self.c.accum
        for s in range(0, len(self.batches), K):
            yield self.batches[s:s + K]

    def run_window(self, window):
        count = torch.tensor(float(sum(len(y) for _, y in window)))
        dist.all_reduce(count)                     # samples in this window on all ranks
        for j, (x, y) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            loss = F.cross_entropy(self.model(x), y, reduction="sum") / count * self.world
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.max_norm)
        self.opt_body.step()
        self.opt_head.step()
        self.opt_body.zero_grad()
        self.opt_head.zero_grad()

    def fit(self):
        for w in self.windows():
            self.run_window(w)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    t = Trainer(Cfg())
    t.fit()
    sha = t.sha()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
