"""Frame-level phone classifier on synthetic filterbank features, FSDP2 (fully_shard).

Accumulation: the K micro-batch losses are summed un-scaled and FSDP's gradient
divide factor folds in the normalisation at the reduce-scatter of the window's
last micro-batch.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, fully_shard


@dataclass
class TrainConfig:
    n_mels: int = 20
    d_model: int = 48
    n_layers: int = 3
    n_phones: int = 12
    frames: int = 16
    micro_batch: int = 4
    grad_accum: int = 4
    steps: int = 10
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 7


class ConvBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, 3, padding=1, groups=1)
        self.ff = nn.Linear(d, d)

    def forward(self, x):  # x: B, T, D
        h = self.norm(x)
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return x + self.ff(F.silu(h))


class FrameClassifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.n_mels, cfg.d_model)
        self.blocks = nn.ModuleList([ConvBlock(cfg.d_model) for _ in range(cfg.n_layers)])
        self.out = nn.Linear(cfg.d_model, cfg.n_phones)

    def forward(self, feats):
        x = self.proj(feats)
        for blk in self.blocks:
            x = blk(x)
        return self.out(x)


def make_batches(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 100)
    n = cfg.steps * cfg.grad_accum * world
    emb = torch.randn(cfg.n_phones, cfg.n_mels, generator=g)
    batches = []
    for i in range(n):
        y = torch.randint(0, cfg.n_phones, (cfg.micro_batch, cfg.frames), generator=g)
        x = emb[y] + 0.7 * torch.randn(cfg.micro_batch, cfg.frames, cfg.n_mels, generator=g)
        batches.append((x, y))
    return batches[rank::world]


def shard_model(model, cfg, world):
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    # The loop sums the K micro-batch losses without dividing; let FSDP's
    # reduce-scatter divide by the number of summed contributions instead.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM
            m.set_gradient_divide_factor(float(cfg.grad_accum))
    return model


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = shard_model(FrameClassifier(cfg), cfg, world)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    batches = make_batches(cfg, rank, world)

    it = iter(batches)
    for step in range(cfg.steps):
        for micro in range(cfg.grad_accum):
            last = micro == cfg.grad_accum - 1
            model.set_requires_gradient_sync(last)
            feats, labels = next(it)
            logits = model(feats)
            loss = F.cross_entropy(logits.reshape(-1, cfg.n_phones), labels.reshape(-1))
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}")

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
