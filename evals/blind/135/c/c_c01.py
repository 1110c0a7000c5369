"""Fabric regression with ragged ranks: rank 0 reads micro-batches of 3 rows, rank 1 of 5 rows.
The loss is the squared error summed over the window and divided by the rows of the window on all
ranks (x world size, since DDP averages). Only the forward runs under no_backward_sync: DDP decides
at forward time whether the following backward all-reduces."""
import hashlib

import torch
import torch.nn as nn
from lightning_fabric import Fabric

K = 3
UPDATES = 10
IN, OUT = 10, 3
CLIP = 0.5


def rows_for(rank):
    return 3 if rank == 0 else 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(IN, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, OUT))

    def forward(self, x):
        return self.f(x)


def batches(rank, n):
    g = torch.Generator().manual_seed(500 + rank)
    w = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(9))
    out = []
    for _ in range(n):
        x = torch.randn(rows_for(rank), IN, generator=g)
        out.append((x, x @ w + 0.1 * torch.randn(rows_for(rank), OUT, generator=g)))
    return out


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(77)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net, opt = fabric.setup(net, opt)
    data = batches(fabric.global_rank, UPDATES * K)

    for u in range(UPDATES):
        window = data[u * K:(u + 1) * K]
        rows = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
        rows_all = fabric.all_reduce(rows, reduce_op="sum")
        for j, (x, y) in enumerate(window):
            with fabric.no_backward_sync(net, enabled=j < K - 1):
                pred = net(x)
            loss = ((pred - y) ** 2).sum() * fabric.world_size / rows_all
            fabric.backward(loss)
        norm = fabric.clip_gradients(net, opt, max_norm=CLIP)
        opt.step()
        opt.zero_grad()
        if fabric.global_rank == 0 and u % 3 == 0:
            print(f"update {u} grad-norm {norm.item():.3f}")

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in net.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
