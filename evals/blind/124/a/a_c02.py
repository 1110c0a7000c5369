"""FSDP2 trainer: windows of up to K micro-batches (the epoch tail is a short window,
stepped over its own length), AdamW on the trunk + SGD on the head, a frozen input
projection, one global clip over both optimizers' sharded gradients."""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

CFG = dict(d_in=16, dim=32, n_out=4, micro=4, K=4, per_rank_batches=10, epochs=3, seed=5, clip=0.4)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Linear(c["d_in"], c["dim"])
        self.trunk = nn.Sequential(nn.Linear(c["dim"], c["dim"]), nn.ReLU(), nn.Linear(c["dim"], c["dim"]))
        self.head = nn.Linear(c["dim"], c["n_out"])

    def forward(self, x):
        h = self.proj(x)
        h = h + self.trunk(h)
        return self.head(F.relu(h))


def batches(rank, epoch, c):
    g = torch.Generator().manual_seed(c["seed"] * 1000 + epoch * 10 + rank)
    for _ in range(c["per_rank_batches"]):
        x = torch.randn(c["micro"], c["d_in"], generator=g)
        yield x, (x[:, :4].argmax(-1) + (x[:, 4] > 0).long()) % c["n_out"]


def windows(it, K):
    buf = []
    for b in it:
        buf.append(b)
        if len(buf) == K:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    c = CFG
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(c["seed"])
    model = Model(c)
    model.proj.requires_grad_(False)
    fully_shard(model.trunk, mesh=mesh)
    fully_shard(model.head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt_trunk = torch.optim.AdamW(model.trunk.parameters(), lr=2e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=5e-2, momentum=0.9)
    optimizers = [opt_trunk, opt_head]
    trainable = [p for p in model.parameters() if p.requires_grad]

    for epoch in range(c["epochs"]):
        for win in windows(batches(rank, epoch, c), c["K"]):
            n = len(win)  # 4, 4, 2 : every rank has the same window lengths
            for j, (x, y) in enumerate(win):
                model.set_requires_gradient_sync(j == n - 1)
                loss = F.cross_entropy(model(x), y)
                (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(trainable, c["clip"])
            for o in optimizers:
                o.step()
                o.zero_grad(set_to_none=True)

    final = []
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        final.append((name, t.detach().float().contiguous()))
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
