"""FSDP2 (fully_shard) classifier trainer with gradient accumulation.

Accumulation is delegated to FSDP2: gradient sync is switched off for the
first micro-steps of a window, and the reduce-scatter divide factor is set so
that the summed micro-batch losses come out averaged -- no `loss / K` needed.
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
    d_in: int = 24
    d_hidden: int = 48
    n_classes: int = 7
    n_blocks: int = 3
    micro_batch: int = 6
    grad_accum: int = 4
    steps: int = 12
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(cfg.d_in, cfg.d_hidden)
        self.blocks = nn.ModuleList(Block(cfg.d_hidden) for _ in range(cfg.n_blocks))
        self.out = nn.Linear(cfg.d_hidden, cfg.n_classes)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def make_data(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.steps * cfg.grad_accum * cfg.micro_batch * world
    x = torch.randn(n, cfg.d_in, generator=g)
    w = torch.randn(cfg.d_in, cfg.n_classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)
    # rank-strided shard, then cut into micro-batches
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(cfg.micro_batch), y.split(cfg.micro_batch)))


def shard_model(model):
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    return model


def configure_accumulation(model, cfg, world):
    # FSDP2 divides the reduce-scattered gradient by this factor; since the
    # micro-batch losses are summed over the window, divide by the window.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
            m.set_gradient_divide_factor(float(cfg.grad_accum))


def param_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = shard_model(Net(cfg))
    configure_accumulation(model, cfg, world)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    batches = make_data(cfg, rank, world)
    K = cfg.grad_accum
    for step in range(cfg.steps):
        window = batches[step * K:(step + 1) * K]
        for i, (x, y) in enumerate(window):
            model.set_requires_gradient_sync(i == len(window) - 1)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    digest = param_digest(model)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
