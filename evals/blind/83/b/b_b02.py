"""DeepSpeed (ZeRO stage 0, fp32) fine-tuning of a tabular regressor.

The engine owns gradient accumulation (gradient_accumulation_steps in the
config); engine.backward / engine.step are called on every micro-batch as the
DeepSpeed docs show. Gradient clipping is done by us so that the clipped norm
can be logged.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro_batch", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--windows_per_epoch", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=20, d_hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden), nn.SiLU(),
            nn.Linear(d_hidden, d_hidden), nn.SiLU(),
            nn.Linear(d_hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


def synthetic_table(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, generator=g)
    y = 3.0 * torch.tanh(x @ w) + x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, 4.0 * y


def ds_config(args, world):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        "gradient_clipping": 0.0,  # clipping is done in train_step
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def train_step(engine, xb, yb, max_grad_norm):
    pred = engine(xb)
    loss = F.mse_loss(pred, yb)
    engine.backward(loss)
    gnorm = torch.nn.utils.clip_grad_norm_(engine.module.parameters(), max_grad_norm)
    engine.step()
    return loss.detach(), gnorm


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(args.seed)

    model = Regressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config(args, world)
    )

    per_epoch = args.windows_per_epoch * args.grad_accum * args.micro_batch
    x_all, y_all = synthetic_table(per_epoch * world, args.seed)
    x_rank, y_rank = x_all[rank::world], y_all[rank::world]

    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 100 + epoch)
        perm = torch.randperm(per_epoch, generator=g)
        for i in range(0, per_epoch, args.micro_batch):
            idx = perm[i : i + args.micro_batch]
            loss, gnorm = train_step(engine, x_rank[idx], y_rank[idx], args.max_grad_norm)
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} gnorm {float(gnorm):.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
