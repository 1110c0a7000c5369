"""Sequence classifier trained with FSDP2 (fully_shard) on 2 CPU ranks.

A small trainer class: each epoch is split into windows of K micro-batches; the epoch's
tail window is shorter and is normalised by what it really holds. Gradient sync is
switched off for the micro-steps inside a window.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class Config:
    vocab: int = 64
    d_model: int = 32
    n_blocks: int = 2
    n_classes: int = 5
    seq_len: int = 12
    micro_bs: int = 4
    grad_accum: int = 4
    batches_per_epoch: int = 10  # per rank; 10 % 4 != 0 -> a short tail window
    epochs: int = 2
    lr: float = 3e-3
    seed: int = 7


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Classifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg.d_model) for _ in range(cfg.n_blocks)])
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h.mean(dim=1))


def synthetic_epoch(cfg, epoch, rank, world):
    g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
    n = cfg.batches_per_epoch * world
    ids = torch.randint(0, cfg.vocab, (n, cfg.micro_bs, cfg.seq_len), generator=g)
    labels = (ids[..., :3].sum(-1) % cfg.n_classes)
    return list(zip(ids[rank::world], labels[rank::world]))


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        model = Classifier(cfg)
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.micro_count = 0
        self.updates = 0

    def _window_len(self, i):
        """How many micro-batches the window holding batch i of the epoch has."""
        cfg = self.cfg
        tail = cfg.batches_per_epoch % cfg.grad_accum
        if tail and i >= cfg.batches_per_epoch - tail:
            return tail
        return cfg.grad_accum

    def micro_step(self, i, ids, labels, boundary):
        self.model.set_requires_gradient_sync(boundary)
        logits = self.model(ids)
        loss = F.cross_entropy(logits, labels, reduction="sum")
        loss = loss / (self._window_len(i) * self.cfg.micro_bs)
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1

    def train_epoch(self, epoch):
        data = synthetic_epoch(self.cfg, epoch, self.rank, self.world)
        last = len(data) - 1
        for i, (ids, labels) in enumerate(data):
            self.micro_count += 1
            boundary = self.micro_count % self.cfg.grad_accum == 0 or i == last
            loss = self.micro_step(i, ids, labels, boundary)
            if boundary:
                self.optimizer_step()
                if self.rank == 0:
                    print(f"epoch {epoch} update {self.updates} loss {loss.item():.4f}", flush=True)

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.train_epoch(epoch)


def final_sha(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = Trainer(Config(), rank, world)
    trainer.fit()
    full = [p.full_tensor() for _, p in trainer.model.named_parameters()]
    sha = final_sha(full)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
