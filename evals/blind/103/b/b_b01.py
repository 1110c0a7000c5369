"""Regression MLP trained with a DeepSpeed ZeRO-0 engine (fp32, CPU/gloo).

The engine owns gradient accumulation (gradient_accumulation_steps in the config)
and all-reduces at the boundary micro-step. DeepSpeed's own clipping is disabled;
we clip by hand so we can log the pre-clip norm per optimizer step.
"""
import argparse
import hashlib
import os

import numpy as np
import torch
import torch.nn as nn
import deepspeed


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden), nn.GELU(),
            nn.Linear(d_hidden, d_hidden), nn.GELU(),
            nn.Linear(d_hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g)
    y = torch.sin(x @ w) * 3.0 + 0.1 * torch.randn(n, generator=g)
    return x, y


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class ClippedDSTrainer:
    def __init__(self, engine, max_norm):
        self.engine = engine
        self.max_norm = max_norm
        self.norms = []

    def _clip(self):
        params = [p for p in self.engine.module.parameters() if p.grad is not None]
        n = torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        self.norms.append(float(n))

    def micro_step(self, x, y):
        out = self.engine(x)
        loss = nn.functional.mse_loss(out, y)
        if self.engine.is_gradient_accumulation_boundary():
            self._clip()
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()

    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }

    model = Regressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    n_micro = args.steps * args.grad_accum
    x, y = make_data(n_micro * args.micro_batch * world, args.seed + 1)
    # contiguous shard per rank, deterministic order
    x = x.view(world, n_micro, args.micro_batch, 16)[rank]
    y = y.view(world, n_micro, args.micro_batch)[rank]

    trainer = ClippedDSTrainer(engine, args.max_grad_norm)
    for i in range(n_micro):
        trainer.micro_step(x[i], y[i])

    assert engine.global_steps == args.steps, engine.global_steps
    if rank == 0:
        print(f"pre-clip norms: {[round(n, 3) for n in trainer.norms]}", flush=True)
        print(f"FINAL_SHA256 {params_sha(engine.module)}", flush=True)


if __name__ == "__main__":
    main()
