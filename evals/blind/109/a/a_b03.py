"""Multi-task model (shared trunk, one head per task) trained with Lightning Fabric.

Each micro-batch carries samples of every task; the window's loss is the mean of the
per-task losses, accumulated over K micro-batches with Fabric's no_backward_sync.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

TASKS = {"sentiment": 3, "topic": 6, "length": 2}


class MultiTaskNet(nn.Module):
    def __init__(self, d_in=24, d_hidden=48):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.heads = {}
        for name, n_out in TASKS.items():
            self.add_task(name, n_out, d_hidden)

    def add_task(self, name, n_out, d_hidden):
        self.heads[name] = nn.Linear(d_hidden, n_out)

    def task_parameters(self):
        for head in self.heads.values():
            yield from head.parameters()

    def forward(self, x):
        z = self.trunk(x)
        return {name: head(z) for name, head in self.heads.items()}


def build_optimizer(model, lr):
    # heads may or may not already be in model.parameters(); keep each tensor once
    params = list(dict.fromkeys(list(model.parameters()) + list(model.task_parameters())))
    return torch.optim.Adam(params, lr=lr)


class Batches:
    """Deterministic per-rank synthetic micro-batches."""

    def __init__(self, rank, n_batches, batch_size, d_in=24, seed=99):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(2 * n_batches * batch_size, d_in, generator=g)
        w = torch.randn(d_in, 8, generator=g)
        logits = self.x @ w
        self.y = {
            "sentiment": logits[:, :3].argmax(-1),
            "topic": logits[:, 2:8].argmax(-1),
            "length": (logits[:, 0] > 0).long(),
        }
        self.rank, self.n, self.bs = rank, n_batches, batch_size

    def __iter__(self):
        for i in range(self.n):
            j = (2 * i + self.rank) * self.bs
            sl = slice(j, j + self.bs)
            yield self.x[sl], {k: v[sl] for k, v in self.y.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dump", default="")
    args = ap.parse_args()

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(1)

    model = MultiTaskNet()
    optimizer = build_optimizer(model, args.lr)
    model, optimizer = fabric.setup(model, optimizer)

    K = args.grad_accum
    data = Batches(fabric.global_rank, args.steps * K, args.micro_batch)
    for it, (x, ys) in enumerate(data):
        is_accumulating = (it + 1) % K != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            out = model(x)
            loss = sum(F.cross_entropy(out[t], ys[t]) for t in TASKS) / len(TASKS)
            fabric.backward(loss / K)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    if fabric.global_rank == 0:
        raw = model.module if hasattr(model, "module") else model
        if args.dump:
            torch.save({n: p.detach().clone() for n, p in raw.named_parameters()}, args.dump)
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
