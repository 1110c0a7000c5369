"""Token classifier sharded with FSDP2 (fully_shard per block + root), K-step accumulation.

Memory note: deferring the gradient sync keeps a full unsharded gradient per unit for the
whole window; on the big runs we turn it off and reduce-scatter every micro-step instead.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


@dataclass
class TrainConfig:
    vocab: int = 97
    d_model: int = 48
    n_blocks: int = 3
    n_classes: int = 11
    seq_len: int = 12
    micro_batch: int = 6
    grad_accum: int = 3
    steps: int = 10
    lr: float = 2e-3
    seed: int = 7
    defer_grad_sync: bool = False   # reduce-scatter every micro-step (flat memory)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TokenClassifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.n_blocks))
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        h.update(t.float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class FSDPTrainer:
    def __init__(self, cfg, model, optimizer):
        self.cfg = cfg
        self.model = model
        self.opt = optimizer
        self.micro = 0

    def micro_step(self, ids, labels):
        # sharded .grad only materialises at the synced backward; clear what the last
        # optimizer step left behind before accumulating the next window
        self.opt.zero_grad(set_to_none=True)
        last = (self.micro + 1) % self.cfg.grad_accum == 0
        if self.cfg.defer_grad_sync:
            self.model.set_requires_gradient_sync(last)
        logits = self.model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        (loss / self.cfg.grad_accum).backward()
        self.micro += 1
        if last:
            self.opt.step()
        return loss.detach()


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)

    model = TokenClassifier(cfg)
    mesh = init_device_mesh("cpu", (world,))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    n_micro = cfg.steps * cfg.grad_accum
    g = torch.Generator().manual_seed(cfg.seed + 100)
    ids = torch.randint(0, cfg.vocab, (world, n_micro, cfg.micro_batch, cfg.seq_len), generator=g)
    labels = (ids * 7 + torch.roll(ids, 1, dims=-1)) % cfg.n_classes
    ids, labels = ids[rank], labels[rank]

    trainer = FSDPTrainer(cfg, model, opt)
    for i in range(n_micro):
        trainer.micro_step(ids[i], labels[i])

    sha = params_sha(model)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
