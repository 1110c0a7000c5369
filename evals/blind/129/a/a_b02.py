"""FSDP2 tagger trainer: a small residual MLP over token features, sharded per block.

Gradient accumulation is done FSDP2-style: reduce-scatter is deferred on the
accumulating micro-steps and turned back on for the last micro-step of a window.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class TrainConfig:
    d_in: int = 24
    d_model: int = 48
    n_blocks: int = 3
    n_classes: int = 7
    micro_batch: int = 8
    grad_accum: int = 4
    n_steps: int = 12
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.d_in, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg.d_model) for _ in range(cfg.n_blocks)])
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, x):
        h = self.proj(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


class ShardedTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = Tagger(cfg)
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        self.model = model
        self.optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        g = torch.Generator().manual_seed(cfg.seed + 1)
        n = cfg.n_steps * cfg.grad_accum * cfg.micro_batch * self.world
        self.x = torch.randn(n, cfg.d_in, generator=g)
        w = torch.randn(cfg.d_in, cfg.n_classes, generator=g)
        self.y = (self.x @ w + 0.3 * torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)

    def micro_batches(self):
        cfg = self.cfg
        i = 0
        while True:
            base = i * cfg.micro_batch * self.world + self.rank * cfg.micro_batch
            if base + cfg.micro_batch > len(self.x):
                return
            yield self.x[base:base + cfg.micro_batch], self.y[base:base + cfg.micro_batch]
            i += 1

    def _sync_mode(self, sync: bool):
        if sync:
            # the root unit owns the post-backward hook that fires the reduce-scatter
            self.model.set_requires_gradient_sync(True, recurse=False)
        else:
            self.model.set_requires_gradient_sync(False)

    def train(self):
        cfg = self.cfg
        self.model.train()
        for micro_step, (x, y) in enumerate(self.micro_batches()):
            boundary = (micro_step + 1) % cfg.grad_accum == 0
            self._sync_mode(boundary)
            logits = self.model(x)
            loss = F.cross_entropy(logits, y) / cfg.grad_accum
            loss.backward()
            if boundary:
                self.optim.step()
                self.optim.zero_grad(set_to_none=True)

    def final_digest(self):
        h = hashlib.sha256()
        flat = []
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            t = full.detach().to(torch.float32).contiguous()
            flat.append(t.reshape(-1))
            h.update(t.numpy().tobytes())
        return h.hexdigest(), torch.cat(flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = ShardedTrainer(TrainConfig())
    trainer.train()
    digest, flat = trainer.final_digest()
    if dist.get_rank() == 0:
        if args.dump:
            torch.save(flat, args.dump)
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
