# Click-through-rate recommender (embedding tables + MLP) on DDP.
# The item table dominates memory, so micro-batch gradients are folded into a
# compact accumulator and .grad is released after every backward.
# torchrun --nproc-per-node 2 a_b02.py
import argparse
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class RecConfig:
    n_users: int = 400
    n_items: int = 1500
    n_dense: int = 8
    dim: int = 16
    micro_batch: int = 64
    accum_steps: int = 4
    total_steps: int = 24
    lr: float = 0.02
    accum_dtype: torch.dtype = torch.float32
    hidden: list = field(default_factory=lambda: [64, 32])
    seed: int = 7


class CTRNet(nn.Module):
    def __init__(self, c: RecConfig):
        super().__init__()
        self.user = nn.Embedding(c.n_users, c.dim)
        self.item = nn.Embedding(c.n_items, c.dim)
        layers, d = [], 2 * c.dim + c.n_dense + c.dim
        for h in c.hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, u, i, dense):
        eu, ei = self.user(u), self.item(i)
        x = torch.cat([eu, ei, dense, eu * ei], dim=-1)
        return self.mlp(x).squeeze(-1)


def make_batch(c, g, truth_u, truth_i):
    u = torch.randint(0, c.n_users, (c.micro_batch,), generator=g)
    i = torch.randint(0, c.n_items, (c.micro_batch,), generator=g)
    dense = torch.randn(c.micro_batch, c.n_dense, generator=g)
    score = (truth_u[u] * truth_i[i]).sum(-1) + 0.5 * dense[:, 0]
    y = (torch.rand(c.micro_batch, generator=g) < torch.sigmoid(score)).float()
    return u, i, dense, y


class GradFolder:
    """Keeps the window's gradient outside of .grad in a chosen dtype."""

    def __init__(self, params, dtype):
        self.params = [p for p in params if p.requires_grad]
        self.buf = [torch.zeros_like(p, dtype=dtype) for p in self.params]

    def fold(self):
        for p, b in zip(self.params, self.buf):
            if p.grad is not None:
                b.add_(p.grad.to(b.dtype))
                p.grad = None

    def release(self):
        for p, b in zip(self.params, self.buf):
            p.grad = b.to(p.dtype)
            b.zero_()


def run(c: RecConfig):
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c.seed)
    model = CTRNet(c)
    ddp = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    folder = GradFolder(model.parameters(), c.accum_dtype)

    gt = torch.Generator().manual_seed(99)
    truth_u = torch.randn(c.n_users, 4, generator=gt)
    truth_i = torch.randn(c.n_items, 4, generator=gt)
    g = torch.Generator().manual_seed(c.seed + 1000 * rank)

    for step in range(c.total_steps):
        run_loss = 0.0
        for _ in range(c.accum_steps):
            u, i, dense, y = make_batch(c, g, truth_u, truth_i)
            logit = ddp(u, i, dense)
            loss = F.binary_cross_entropy_with_logits(logit, y)
            # DDP averages over ranks on every backward; the folder sums the window
            (loss / c.accum_steps).backward()
            folder.fold()
            run_loss += loss.item() / c.accum_steps
        folder.release()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 6 == 0:
            print(f"step {step:3d} bce {run_loss:.4f}", flush=True)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=RecConfig.total_steps)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    cfg = RecConfig(total_steps=args.steps)
    model = run(cfg)
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if dist.get_rank() == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
