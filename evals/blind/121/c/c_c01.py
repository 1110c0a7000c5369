"""Fabric regression with a frozen embedding, two optimizers and a mid-run resume.

Ranks hold different micro-batch sizes (3 and 5 rows). Each window's loss is the sum of
squared errors over the window's all-ranks row count, times the world size (DDP averages).
One clip per window, after the last backward. The run stops after 6 updates, saves, and a
fresh set of objects loads the checkpoint and finishes the remaining updates.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from lightning_fabric import Fabric

K, UPDATES, STOP_AT, SEED = 3, 12, 6, 5
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c01_ckpt.pt")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.emb.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(8 + 4, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, ids, x):
        return self.head(self.body(torch.cat([self.emb(ids), x], -1))).squeeze(-1)


def batch(update, micro, rank):
    rows = 3 if rank == 0 else 5
    g = torch.Generator().manual_seed(SEED * 1000 + update * 10 + micro + 500 * rank)
    ids = torch.randint(0, 20, (rows,), generator=g)
    x = torch.randn(rows, 4, generator=g)
    y = x.sum(-1) + 0.1 * ids.float() + 0.05 * torch.randn(rows, generator=g)
    return ids, x, y


def build(fabric):
    torch.manual_seed(SEED)
    net = Net()
    body_opt = torch.optim.AdamW(net.body.parameters(), lr=3e-3, weight_decay=0.05)
    head_opt = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    model = fabric.setup_module(net)
    body_opt, head_opt = fabric.setup_optimizers(body_opt, head_opt)
    return net, model, body_opt, head_opt


def run(fabric, net, model, body_opt, head_opt, start, stop):
    world = fabric.world_size
    for update in range(start, stop):
        batches = [batch(update, m, fabric.global_rank) for m in range(K)]
        n_rows = torch.tensor(float(sum(len(b[2]) for b in batches)))
        dist.all_reduce(n_rows)
        for m, (ids, x, y) in enumerate(batches):
            with fabric.no_backward_sync(model, enabled=m < K - 1):
                loss = ((model(ids, x) - y) ** 2).sum() / n_rows * world
                fabric.backward(loss)
        torch.nn.utils.clip_grad_norm_([p for p in net.parameters() if p.requires_grad], 0.5)
        body_opt.step()
        head_opt.step()
        body_opt.zero_grad(set_to_none=True)
        head_opt.zero_grad(set_to_none=True)


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    os.makedirs(os.path.dirname(CKPT), exist_ok=True)
    net, model, body_opt, head_opt = build(fabric)
    run(fabric, net, model, body_opt, head_opt, 0, STOP_AT)
    fabric.save(CKPT, {"model": model, "body_opt": body_opt, "head_opt": head_opt,
                       "update": STOP_AT})
    del net, model, body_opt, head_opt

    net, model, body_opt, head_opt = build(fabric)
    state = {"model": model, "body_opt": body_opt, "head_opt": head_opt}
    rest = fabric.load(CKPT, state)
    run(fabric, net, model, body_opt, head_opt, rest["update"], UPDATES)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
