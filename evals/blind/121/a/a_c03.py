"""Compiled DDP trainer: torch.compile over a DDP-wrapped regressor, two optimizers
(AdamW for the trunk, SGD with momentum for the head), a worker DataLoader,
K = 3 with `no_sync` on the first two micro-batches of each window.
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

K, MICRO, EPOCHS = 3, 8, 2
N = 2 * 5 * K * MICRO   # 5 windows per rank per epoch


class Trunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(20, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.trunk(x))


class CompiledDDPTrainer:
    def __init__(self):
        self.rank = dist.get_rank()
        torch.manual_seed(21)
        net = Trunk()
        self.ddp = DDP(net)
        self.fwd = torch.compile(self.ddp, backend="aot_eager", dynamic=False)
        self.opts = [
            torch.optim.AdamW(net.trunk.parameters(), lr=3e-3),
            torch.optim.SGD(net.head.parameters(), lr=2e-2, momentum=0.9),
        ]
        g = torch.Generator().manual_seed(5)
        x = torch.randn(N, 20, generator=g)
        y = torch.stack([x[:, :5].sum(1), x[:, 5:10].prod(1), x[:, 10:].abs().mean(1)], 1)
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=9)
        self.loader = DataLoader(ds, batch_size=MICRO, sampler=self.sampler, num_workers=1,
                                 persistent_workers=True)

    def step(self):
        for o in self.opts:
            o.step()
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def run(self):
        updates = 0
        for epoch in range(EPOCHS):
            self.sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(self.loader):
                sync = (i + 1) % K == 0
                with (nullcontext() if sync else self.ddp.no_sync()):
                    loss = F.smooth_l1_loss(self.fwd(x), y) / K
                    loss.backward()
                if sync:
                    self.step()
                    updates += 1
        return updates

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    t = CompiledDDPTrainer()
    n = t.run()
    d = t.digest()
    if t.rank == 0:
        print(f"updates {n}")
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
