"""DeepSpeed ZeRO-2 regression trainer.

The DeepSpeed config is generated from a small dataclass so that experiments
can override single fields from the command line.  The engine does the
gradient accumulation (engine.backward / engine.step on every micro-batch).
"""
import argparse
import hashlib
from dataclasses import dataclass, fields

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class DSSettings:
    train_micro_batch_size_per_gpu: int = 8
    gradient_accumulation_steps: int = 4
    gradient_clipping: float = 0.0      # 0 = no clipping for this recipe
    zero_stage: int = 2
    bf16: bool = False
    steps_per_print: int = 1000
    wall_clock_breakdown: bool = False

    def to_ds_config(self):
        raw = {
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "gradient_clipping": self.gradient_clipping,
            "zero_optimization": {"stage": self.zero_stage,
                                  "contiguous_gradients": False,
                                  "overlap_comm": False},
            "bf16": {"enabled": True} if self.bf16 else None,
            "zero_allow_untested_optimizer": True,
            "steps_per_print": self.steps_per_print,
            "wall_clock_breakdown": self.wall_clock_breakdown,
        }
        # leave out unset/disabled sections so DeepSpeed keeps its own defaults
        return {k: v for k, v in raw.items() if v is not None}


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=7)
    for f in fields(DSSettings):
        p.add_argument("--" + f.name, type=type(f.default), default=f.default)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_h=64, d_out=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_h), nn.Tanh(),
                                 nn.Linear(d_h, d_h), nn.Tanh(),
                                 nn.Linear(d_h, d_out))

    def forward(self, x):
        return self.net(x)


def synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = 3.0 * torch.randn(16, 4, generator=g)
    y = x @ w + torch.sin(x[:, :4]) * 2.0
    return x, y


def digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    settings = DSSettings(**{f.name: getattr(args, f.name) for f in fields(DSSettings)})
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=settings.to_ds_config())

    mb, K = settings.train_micro_batch_size_per_gpu, settings.gradient_accumulation_steps
    x, y = synthetic(args.steps * K * mb * world, args.seed + 100)
    x, y = x[rank::world], y[rank::world]
    loss_fn = nn.MSELoss()

    for i, (xb, yb) in enumerate(zip(x.split(mb), y.split(mb))):
        loss = loss_fn(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        if rank == 0 and (i + 1) % (4 * K) == 0:
            print(f"step {engine.global_steps} loss {loss.item():.4f}", flush=True)

    sha = digest(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
