"""Multi-task regression + classification with learned task uncertainty
(Kendall et al. 2018) on a DeepSpeed engine, ZeRO stage 0, gradient accumulation 4."""
import argparse
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class MultiTaskNet(nn.Module):
    def __init__(self, d_in=16, d_hid=64, n_cls=5):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, d_hid), nn.GELU(), nn.Linear(d_hid, d_hid), nn.GELU())
        self.reg_head = nn.Linear(d_hid, 1)
        self.cls_head = nn.Linear(d_hid, n_cls)

    def forward(self, x):
        h = self.trunk(x)
        return self.reg_head(h).squeeze(-1), self.cls_head(h)


class UncertaintyWeighting(nn.Module):
    """L = sum_i exp(-s_i) * L_i + s_i, with s_i = log sigma_i^2 learned."""

    def __init__(self, n_tasks=2):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n_tasks))

    def forward(self, losses):
        total = 0.0
        for i, l in enumerate(losses):
            total = total + torch.exp(-self.log_vars[i]) * l + self.log_vars[i]
        return total


def make_data(rank, n, seed, d_in=16, n_cls=5):
    g = torch.Generator().manual_seed(seed + 17 * rank)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, generator=torch.Generator().manual_seed(seed))
    y_reg = 3.0 * (x @ w) + 0.5 * torch.randn(n, generator=g)
    y_cls = (x[:, :n_cls] * 2).argmax(-1)
    return x, y_reg, y_cls


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    model = MultiTaskNet()
    weighting = UncertaintyWeighting(2)
    optimizer = torch.optim.AdamW(
        [
            {"params": model.parameters(), "weight_decay": 0.01},
            {"params": weighting.parameters(), "weight_decay": 0.0, "lr": 5e-2},
        ],
        lr=args.lr,
    )

    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    n_micro = args.steps * args.grad_accum
    x, y_reg, y_cls = make_data(rank, n_micro * args.micro_batch, args.seed)

    for i in range(n_micro):
        sl = slice(i * args.micro_batch, (i + 1) * args.micro_batch)
        pred_reg, logits = engine(x[sl])
        loss = weighting([F.mse_loss(pred_reg, y_reg[sl]), F.cross_entropy(logits, y_cls[sl])])
        at_boundary = engine.is_gradient_accumulation_boundary()
        engine.backward(loss)
        if at_boundary:
            # the weighting lives outside the engine: average its gradient by hand
            for p in weighting.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        engine.step()
        if at_boundary:
            # the engine only clears its own module's gradients
            weighting.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in list(engine.module.named_parameters()) + list(weighting.named_parameters()):
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("log_vars", weighting.log_vars.detach().tolist())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()


if __name__ == "__main__":
    main()
