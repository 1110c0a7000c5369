"""Two-tower CTR model with importance-weighted BCE, sharded with FSDP2 (fully_shard).

- micro-batches have a random number of impressions (5..12) and per-sample weights
- an optimizer step's loss is sum(w * bce) / sum(w) over the window on all ranks;
  FSDP2 averages gradients over ranks, so each micro-batch is scaled by world / W_all
- 11 micro-batches per rank per epoch with accum 4 -> windows of 4, 4, 3
- a frozen item-category table, AdamW for the MLPs, SGD for the id embeddings,
  one LambdaLR per optimizer stepped once per optimizer step, a clip that acts
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--micro-per-epoch", type=int, default=11)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--items", type=int, default=600)
    ap.add_argument("--cats", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--emb-lr", type=float, default=0.3)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=11)
    return ap.parse_args()


class Tower(nn.Module):
    def __init__(self, d_in, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return self.net(x)


class TwoTower(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.user_emb = nn.Embedding(a.users, a.dim)
        self.item_emb = nn.Embedding(a.items, a.dim)
        self.cat_emb = nn.Embedding(a.cats, a.dim)
        self.cat_emb.weight.requires_grad_(False)  # pretrained taxonomy, kept fixed
        self.user_tower = Tower(a.dim, a.dim)
        self.item_tower = Tower(2 * a.dim, a.dim)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, u, i, c):
        qu = self.user_tower(self.user_emb(u))
        qi = self.item_tower(torch.cat([self.item_emb(i), self.cat_emb(c)], -1))
        return (qu * qi).sum(-1) + self.bias


def epoch_data(a, rank, epoch, item_cat):
    g = torch.Generator().manual_seed(a.seed * 1000 + rank * 37 + epoch)
    out = []
    for _ in range(a.micro_per_epoch):
        n = int(torch.randint(5, 13, (1,), generator=g))
        u = torch.randint(0, a.users, (n,), generator=g)
        i = torch.randint(0, a.items, (n,), generator=g)
        y = (torch.rand(n, generator=g) < torch.sigmoid(((u % 7) - (i % 5)).float() / 3)).float()
        w = 0.5 + torch.rand(n, generator=g)  # inverse propensity weights
        out.append((u, i, item_cat[i], y, w))
    return out


def main():
    a = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    model = TwoTower(a)
    fully_shard(model.user_tower)
    fully_shard(model.item_tower)
    fully_shard(model)

    emb = [model.user_emb.weight, model.item_emb.weight]
    dense = [p for n, p in model.named_parameters() if p.requires_grad and "_emb" not in n]
    opt_dense = torch.optim.AdamW(dense, lr=a.lr, weight_decay=0.01)
    opt_emb = torch.optim.SGD(emb, lr=a.emb_lr)
    steps_per_epoch = math.ceil(a.micro_per_epoch / a.accum)
    total = steps_per_epoch * a.epochs
    warm = 3
    lam = lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1 - s / total)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lam) for o in (opt_dense, opt_emb)]

    item_cat = torch.randint(0, a.cats, (a.items,), generator=torch.Generator().manual_seed(5))
    step = 0
    for epoch in range(a.epochs):
        data = epoch_data(a, rank, epoch, item_cat)
        for start in range(0, len(data), a.accum):
            window = data[start:start + a.accum]
            w_all = torch.stack([b[4].sum() for b in window]).sum().reshape(1)
            dist.all_reduce(w_all)
            for j, (u, i, c, y, w) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logit = model(u, i, c)
                bce = F.binary_cross_entropy_with_logits(logit, y, reduction="none")
                ((w * bce).sum() * world / w_all).sum().backward()
            gn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], a.clip)
            for o in (opt_dense, opt_emb):
                o.step()
            for s in scheds:
                s.step()
            for o in (opt_dense, opt_emb):
                o.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                gnv = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                print(f"epoch {epoch} step {step} window {len(window)} grad_norm {float(gnv):.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
