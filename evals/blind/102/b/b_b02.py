"""ZeRO-2 regression trainer (DeepSpeed engine, client AdamW + warm-up).

The effective batch is expressed the DeepSpeed way, through train_batch_size;
the micro-batch loop groups `grad_accum` backwards per update.
"""
import hashlib
import math
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Settings:
    in_dim: int = 24
    hidden: int = 64
    out_dim: int = 4
    micro_batch: int = 8
    grad_accum: int = 2
    updates: int = 24
    lr: float = 2e-3
    warmup: int = 4
    clip: float = 0.5
    seed: int = 7

    def ds_config(self, world_size: int) -> dict:
        return {
            "train_batch_size": self.micro_batch * self.grad_accum * world_size,
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_clipping": self.clip,
            "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
            "zero_allow_untested_optimizer": True,
            "wall_clock_breakdown": False,
            "steps_per_print": 10_000,
        }


class Regressor(nn.Module):
    def __init__(self, s: Settings):
        super().__init__()
        self.inp = nn.Linear(s.in_dim, s.hidden)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(s.hidden), nn.Linear(s.hidden, s.hidden), nn.SiLU())
                                     for _ in range(2)])
        self.out = nn.Linear(s.hidden, s.out_dim)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h)


def synthetic_shard(s: Settings, rank: int, world: int):
    g = torch.Generator().manual_seed(s.seed + 101)
    n = s.updates * s.grad_accum * s.micro_batch * world
    x = torch.randn(n, s.in_dim, generator=g)
    w = torch.randn(s.in_dim, s.out_dim, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, s.out_dim, generator=g)
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(s.micro_batch), y.split(s.micro_batch)))


def warmup_cosine(s: Settings):
    def f(step):
        if step < s.warmup:
            return (step + 1) / s.warmup
        t = (step - s.warmup) / max(1, s.updates - s.warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return f


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    s = Settings()

    torch.manual_seed(s.seed)
    model = Regressor(s)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(s))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=s.ds_config(world))

    data = synthetic_shard(s, rank, world)
    it = iter(data)
    for update in range(s.updates):
        for _ in range(s.grad_accum):
            x, y = next(it)
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
        engine.step()

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
