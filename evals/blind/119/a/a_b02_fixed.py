"""Contrastive dual encoder with a learned temperature, trained with FSDP2 (fully_shard)."""
import argparse
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--emb", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Tower(nn.Module):
    def __init__(self, dim, emb):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, emb))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self, dim, emb):
        super().__init__()
        self.query = Tower(dim, emb)
        self.doc = Tower(dim, emb)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, q, d):
        zq, zd = self.query(q), self.doc(d)
        return self.logit_scale.exp() * zq @ zd.t()


class FSDPTrainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        model = DualEncoder(args.dim, args.emb)
        fully_shard(model.query)
        fully_shard(model.doc)
        # the temperature is a scalar: keep it out of the sharded flat groups
        fully_shard(model, ignored_params={model.logit_scale})
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(args.seed + 1000 * self.rank)
        n = args.steps * args.grad_accum
        self.q = torch.randn(n, args.micro_batch, args.dim, generator=g)
        self.d = self.q @ torch.randn(args.dim, args.dim, generator=g) * 0.3 + torch.randn(n, args.micro_batch, args.dim, generator=g)

    def micro_step(self, i, last):
        self.model.set_requires_gradient_sync(last)
        logits = self.model(self.q[i], self.d[i])
        target = torch.arange(logits.shape[0])
        loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))
        (loss / self.args.grad_accum).backward()

    def train(self):
        K = self.args.grad_accum
        for step in range(self.args.steps):
            for k in range(K):
                self.micro_step(step * K + k, last=(k == K - 1))
            # FSDP2 does not reduce ignored parameters: average the temperature by hand
            g = self.model.logit_scale.grad
            dist.all_reduce(g)
            g.div_(dist.get_world_size())
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = FSDPTrainer(parse_args())
    trainer.train()
    sha = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
