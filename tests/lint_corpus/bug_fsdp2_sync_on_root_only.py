# corpus: style=fsdp2 class=F11
"""FSDP2 with per-block units; the sync is deferred over the window by hand."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

GRAD_ACCUM = 4


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))
        self.out = torch.nn.Linear(64, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def train(loader, steps):
    dist.init_process_group("gloo")
    net = Net()
    for layer in net.layers:
        fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    it = iter(loader)
    for _ in range(steps):
        for micro in range(GRAD_ACCUM):
            final = micro == GRAD_ACCUM - 1
            if final:
                net.set_requires_gradient_sync(True, recurse=False)  # expect: AG181
            else:
                net.set_requires_gradient_sync(False)
            x, y = next(it)
            (F.cross_entropy(net(x), y) / GRAD_ACCUM).backward()
        opt.step()
        opt.zero_grad()
