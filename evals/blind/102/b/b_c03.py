"""DDP with a summing comm hook and two optimizers.

Micro-batches have ragged sizes that differ across ranks, and an epoch of 7
micro-batches with K = 3 ends in a one-batch window.  Every window is normalised
by its all-ranks example count, so the gradients must be *summed* across ranks:
the registered comm hook does a plain SUM all-reduce (no 1/world).  Non-final
micro-batches run under no_sync().  The trunk uses AdamW, the head SGD with
momentum; both step once per window.
"""
import hashlib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class Cfg:
    feat: int = 20
    hidden: int = 48
    classes: int = 6
    accum: int = 3
    batches_per_epoch: int = 7
    epochs: int = 3
    seed: int = 5150


def sum_allreduce_hook(process_group, bucket):
    buf = bucket.buffer()
    fut = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class Net(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(c.feat, c.hidden), nn.ReLU(), nn.LayerNorm(c.hidden),
                                   nn.Linear(c.hidden, c.hidden), nn.ReLU())
        self.head = nn.Linear(c.hidden, c.classes)

    def forward(self, x):
        return self.head(self.trunk(x))


class Trainer:
    def __init__(self, c: Cfg):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        self.net = Net(c)
        self.ddp = DDP(self.net, gradient_as_bucket_view=True)
        self.ddp.register_comm_hook(None, sum_allreduce_hook)
        self.opt_trunk = torch.optim.AdamW(self.net.trunk.parameters(), lr=3e-3, weight_decay=0.02)
        self.opt_head = torch.optim.SGD(self.net.head.parameters(), lr=5e-2, momentum=0.9)
        self.proj = torch.randn(c.feat, c.classes, generator=torch.Generator().manual_seed(c.seed))

    def epoch_batches(self, epoch):
        g = torch.Generator().manual_seed(self.c.seed + 97 * epoch + self.rank)
        out = []
        for _ in range(self.c.batches_per_epoch):
            n = int(torch.randint(3, 12, (1,), generator=g))
            x = torch.randn(n, self.c.feat, generator=g)
            out.append((x, (x @ self.proj).argmax(1)))
        return out

    def window_count(self, window):
        n = torch.tensor(float(sum(len(y) for _, y in window)))
        dist.all_reduce(n)
        return n

    def run_window(self, window):
        denom = self.window_count(window)
        for j, (x, y) in enumerate(window):
            ctx = self.ddp.no_sync() if j < len(window) - 1 else nullcontext()
            with ctx:
                loss = F.cross_entropy(self.ddp(x), y, reduction="sum") / denom
                loss.backward()
        self.opt_trunk.step()
        self.opt_head.step()
        self.opt_trunk.zero_grad(set_to_none=True)
        self.opt_head.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.c.epochs):
            batches = self.epoch_batches(epoch)
            for s in range(0, len(batches), self.c.accum):
                self.run_window(batches[s:s + self.c.accum])

    def digest(self):
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in self.net.named_parameters()])
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    dist.init_process_group("gloo")
    t = Trainer(Cfg())
    t.fit()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {t.digest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
