"""Tiny DDPM-style denoiser, ported from a JAX/optax training loop.

Gradients are computed functionally (torch.autograd.grad), summed into fp32
accumulators over the window, averaged over ranks by hand, then handed to AdamW.
Launched with torchrun on 2 ranks.
"""
import argparse
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.05)
    p.add_argument("--timesteps", type=int, default=100)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Denoiser(nn.Module):
    def __init__(self, dim, hidden, timesteps):
        super().__init__()
        self.t_embed = nn.Embedding(timesteps, hidden)
        self.inp = nn.Linear(dim, hidden)
        self.mid = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.out = nn.Linear(hidden, dim)

    def forward(self, x_t, t):
        h = self.inp(x_t) + self.t_embed(t)
        return self.out(self.mid(h))


def cosine_alphas_bar(T):
    s = 0.008
    steps = torch.arange(T + 1, dtype=torch.float64) / T
    f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(1e-5, 1.0).float()


def clip_by_global_norm(grads, max_norm):
    """optax.clip_by_global_norm"""
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return [g * scale for g in grads]


def sample_data(n, dim, gen):
    # mixture of two gaussians
    centers = torch.stack([torch.full((dim,), 2.0), torch.full((dim,), -2.0)])
    idx = torch.randint(0, 2, (n,), generator=gen)
    return centers[idx] + 0.3 * torch.randn(n, dim, generator=gen)


def loss_fn(model, x0, alphas_bar, gen):
    t = torch.randint(0, alphas_bar.numel(), (x0.shape[0],), generator=gen)
    noise = torch.randn(x0.shape, generator=gen)
    ab = alphas_bar[t].unsqueeze(-1)
    x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    return F.mse_loss(model(x_t, t), noise)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    model = Denoiser(args.dim, args.hidden, args.timesteps)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    alphas_bar = cosine_alphas_bar(args.timesteps)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    acc = [torch.zeros_like(p) for p in params]
    for step in range(args.steps):
        for micro in range(args.accum):
            x0 = sample_data(args.micro_batch, args.dim, gen)
            loss = loss_fn(model, x0, alphas_bar, gen) / args.accum
            grads = torch.autograd.grad(loss, params)
            for a, g in zip(acc, grads):
                a.add_(g)

        flat = torch.cat([a.view(-1) for a in acc])
        dist.all_reduce(flat)
        flat /= world
        grads = list(torch.split(flat, [a.numel() for a in acc]))
        grads = [g.view_as(a) for g, a in zip(grads, acc)]
        grads = clip_by_global_norm(grads, args.max_grad_norm)

        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for a in acc:
            a.zero_()
        if rank == 0 and (step + 1) % 6 == 0:
            print(f"step {step + 1} loss {loss.item() * args.accum:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("DUMP_PARAMS"):
            torch.save([p.detach().clone() for p in params], os.environ["DUMP_PARAMS"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
