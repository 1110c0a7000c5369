"""2-D parallel (tp x dp) training of a small tagger with DDP over the data-parallel axis.

Launch: torchrun --nproc-per-node 2 b_b01.py   (tp=1, dp=2 on this box)
"""
import argparse
import contextlib
import dataclasses
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class ParallelDims:
    world_size: int
    tp: int = 1

    @property
    def dp(self) -> int:
        return self.world_size // self.tp


@dataclasses.dataclass
class TrainConfig:
    vocab: int = 64
    dim: int = 32
    n_classes: int = 5
    seq: int = 12
    micro_bs: int = 6
    grad_accum: int = 4
    steps: int = 20
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234


def build_groups(dims: ParallelDims):
    """Tensor-parallel groups are blocks of consecutive ranks; data-parallel groups are strided."""
    tp_group, _ = dist.new_subgroups(group_size=dims.tp)
    dp_groups = [dist.new_group(list(range(t, dims.world_size, dims.tp))) for t in range(dims.tp)]
    dp_group = dp_groups[dist.get_rank() % dims.tp]
    return tp_group, dp_group


class Tagger(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.mix = nn.Sequential(nn.Linear(cfg.dim, 2 * cfg.dim), nn.GELU(), nn.Linear(2 * cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.n_classes)

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + self.mix(h)
        return self.head(self.norm(h).mean(dim=1))


def make_data(cfg: TrainConfig, dp_rank: int, dp_size: int):
    g = torch.Generator().manual_seed(cfg.seed + 17)
    total = cfg.steps * cfg.grad_accum * cfg.micro_bs * dp_size
    x = torch.randint(0, cfg.vocab, (total, cfg.seq), generator=g)
    y = (x[:, :3].sum(dim=1) + x[:, -1]) % cfg.n_classes
    x, y = x[dp_rank::dp_size], y[dp_rank::dp_size]
    return list(zip(x.split(cfg.micro_bs), y.split(cfg.micro_bs)))


def params_sha(module: nn.Module) -> str:
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in module.named_parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=TrainConfig.grad_accum)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    dims = ParallelDims(world_size=dist.get_world_size(), tp=args.tp)
    cfg = TrainConfig(grad_accum=args.grad_accum)
    tp_group, dp_group = build_groups(dims)
    dp_rank = dist.get_rank(dp_group)

    torch.manual_seed(cfg.seed)
    model = Tagger(cfg)
    ddp = DDP(model, process_group=dp_group)
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    batches = make_data(cfg, dp_rank, dims.dp)
    for step in range(cfg.steps):
        window = batches[step * cfg.grad_accum:(step + 1) * cfg.grad_accum]
        for i, (x, y) in enumerate(window):
            last = i == len(window) - 1
            ctx = contextlib.nullcontext() if last else ddp.no_sync()
            with ctx:
                loss = F.cross_entropy(ddp(x), y) / cfg.grad_accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {params_sha(model)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
