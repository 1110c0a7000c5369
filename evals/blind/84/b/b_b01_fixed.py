"""Regression head fine-tune with a DeepSpeed ZeRO-2 engine (engine API).

Launched with torchrun; DeepSpeed owns accumulation (gradient_accumulation_steps in
the config) and the loop just calls engine.backward / engine.step on every micro-batch.
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import deepspeed


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_hidden), nn.Tanh())
        self.head = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.head(self.body(x))


def ds_config(args, world_size):
    return {
        "train_micro_batch_size_per_gpu": args.micro_bs,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_bs * args.grad_accum * world_size,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": False},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g) * 3.0
    y = x @ w + 0.1 * torch.randn(n, 4, generator=g)
    return x, y


def final_sha(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(args.seed)

    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args, world))

    n_micro = args.steps * args.grad_accum
    x, y = make_data(n_micro * args.micro_bs * world, args.seed + 1)
    # rank r takes micro-batches r, r + W, r + 2W, ...
    xs = x.view(n_micro * world, args.micro_bs, 16)[rank::world]
    ys = y.view(n_micro * world, args.micro_bs, 4)[rank::world]

    loss_fn = nn.MSELoss()
    for i in range(n_micro):
        out = engine(xs[i])
        loss = loss_fn(out, ys[i])
        engine.backward(loss)
        engine.step()
        if rank == 0 and (i + 1) % 12 == 0:
            print(f"micro {i + 1} loss {loss.item():.4f}", flush=True)

    sha = final_sha([p for _, p in engine.module.named_parameters()])
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
