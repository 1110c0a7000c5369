"""ZeRO-2 regression trainer. The loop was ported from our DDP script and
keeps its own accumulation (loss / K, one engine.step() per window), so the
DeepSpeed config asks for a global batch of one micro-batch per rank."""
import argparse
import hashlib
import json

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dim", type=int, default=20)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


def ds_config(args, world_size):
    # the loop accumulates itself: one engine "batch" is one micro-batch per rank
    return {
        "train_batch_size": args.micro_batch * world_size,
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 2, "contiguous_gradients": True,
                              "overlap_comm": False},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class Regressor(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, 48), nn.Tanh(), nn.LayerNorm(48),
                                  nn.Linear(48, 48), nn.Tanh())
        self.out = nn.Linear(48, 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)


def make_data(args, rank, world):
    g = torch.Generator().manual_seed(args.seed + 100)
    n = args.steps * args.accum * world
    w = torch.randn(args.dim, generator=g)
    x = torch.randn(n, args.micro_batch, args.dim, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, args.micro_batch, generator=g)
    return x[rank::world], y[rank::world]


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = Regressor(args.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=ds_config(args, world))
    xs, ys = make_data(args, rank, world)
    K = args.accum
    for i in range(xs.shape[0]):
        pred = engine(xs[i])
        loss = nn.functional.mse_loss(pred, ys[i]) / K
        engine.set_gradient_accumulation_boundary((i + 1) % K == 0)
        engine.backward(loss)
        if (i + 1) % K == 0:
            engine.step()
            if rank == 0 and ((i + 1) // K) % 4 == 0:
                print(f"step {(i + 1) // K} loss {loss.item() * K:.4f}", flush=True)

    flat = torch.cat([p.detach().float().reshape(-1)
                      for _, p in engine.module.named_parameters()])
    digest = hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)


if __name__ == "__main__":
    main()
