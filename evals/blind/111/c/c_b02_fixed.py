"""Dual-encoder retrieval (query tower / document tower) with in-batch negatives, Lightning Fabric DDP.

K micro-batches per optimizer step; the sync is deferred with ``fabric.no_backward_sync`` until the
window's last micro-batch.  Each micro-batch's InfoNCE mean is divided by K.
"""
import argparse
import hashlib
import math
import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49205")

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--feat-dim", type=int, default=40)
    p.add_argument("--emb-dim", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--n-pairs", type=int, default=384)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Tower(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.LayerNorm(64), nn.Linear(64, d_out))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.query_tower = Tower(d_in, d_out)
        self.doc_tower = Tower(d_in, d_out)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, q, d):
        return self.query_tower(q), self.doc_tower(d)


def info_nce(qe, de, logit_scale):
    logits = logit_scale.exp() * qe @ de.t()
    target = torch.arange(qe.size(0))
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def make_pairs(args):
    g = torch.Generator().manual_seed(args.seed)
    latent = torch.randn(args.n_pairs, 8, generator=g)
    wq = torch.randn(8, args.feat_dim, generator=g)
    wd = torch.randn(8, args.feat_dim, generator=g)
    q = latent @ wq + 0.3 * torch.randn(args.n_pairs, args.feat_dim, generator=g)
    d = latent @ wd + 0.3 * torch.randn(args.n_pairs, args.feat_dim, generator=g)
    return TensorDataset(q, d)


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="32-true")
    fabric.launch()
    fabric.seed_everything(args.seed)

    model = DualEncoder(args.feat_dim, args.emb_dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(
        DataLoader(make_pairs(args), batch_size=args.micro_batch, shuffle=True,
                   generator=torch.Generator().manual_seed(args.seed)))

    steps_per_epoch = len(loader) // args.accum
    total_steps = steps_per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * max(0.0, 1 - s / total_steps))

    step = 0
    for epoch in range(args.epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for i, (q, d) in enumerate(loader):
            is_accumulating = (i + 1) % args.accum != 0
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                qe, de = model(q, d)
                loss = info_nce(qe, de, model.logit_scale) / args.accum
                fabric.backward(loss)
            if not is_accumulating:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                sched.step()
                step += 1
        fabric.print(f"epoch {epoch} steps {step} loss {loss.item() * args.accum:.4f}")

    if fabric.global_rank == 0:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
