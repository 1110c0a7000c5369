"""Tabular classifier trained with FSDP2 (fully_shard per residual block + root).

Gradient accumulation with the reduce-scatter deferred until the last micro-batch of
each window.  Windows are kept whole: an incomplete window at the end of an epoch is
thrown away, as our DDP recipe always did.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class RunConfig:
    in_dim: int = 24
    width: int = 64
    depth: int = 3
    n_classes: int = 6
    micro_bs: int = 8
    micro_per_epoch: int = 10      # per rank; 10 % 4 = 2 left over each epoch
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 3e-3
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.norm(h))))


class TabNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.stem = nn.Linear(cfg.in_dim, cfg.width)
        self.blocks = nn.ModuleList([Block(cfg.width) for _ in range(cfg.depth)])
        self.head = nn.Linear(cfg.width, cfg.n_classes)

    def forward(self, x):
        h = self.stem(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


def make_epoch(cfg, epoch, rank):
    g = torch.Generator().manual_seed(cfg.seed * 7 + 100 * epoch + rank)
    n = cfg.micro_bs * cfg.micro_per_epoch
    x = torch.randn(n, cfg.in_dim, generator=g)
    w = torch.linspace(-1, 1, cfg.in_dim * cfg.n_classes).view(cfg.in_dim, cfg.n_classes)
    y = (x @ w + 0.3 * torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)
    return list(zip(x.split(cfg.micro_bs), y.split(cfg.micro_bs)))


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        model = TabNet(cfg)
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.updates = 0

    def micro_step(self, x, y, sync):
        self.model.set_requires_gradient_sync(sync)
        logits = self.model(x)
        loss = F.cross_entropy(logits, y) / self.cfg.grad_accum
        loss.backward()
        return loss.detach()

    def train_epoch(self, epoch):
        K = self.cfg.grad_accum
        batches = make_epoch(self.cfg, epoch, self.rank)
        batches = batches[: len(batches) // K * K]
        for i, (x, y) in enumerate(batches):
            boundary = (i + 1) % K == 0
            self.micro_step(x, y, sync=boundary)
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                self.updates += 1
        # incomplete window: discard what was accumulated
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.train_epoch(epoch)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(RunConfig())
    trainer.fit()
    digest = trainer.final_digest()
    if dist.get_rank() == 0:
        print(f"updates={trainer.updates}")
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
