"""DDPM-style denoiser on 2 DDP ranks with a worker DataLoader.

- noise and timesteps are drawn inside the Dataset from a per-index generator, so the
  DataLoader worker process yields the same batches on every run
- gradient accumulation with DDP.no_sync on all but the last micro-step of a window
- the LR schedule is a LambdaLR with one lambda per parameter group (the time embedding is held
  at LR 0 for the first steps) and it is advanced by an optimizer step post-hook
- EMA of the weights, updated after each optimizer step
"""
import contextlib
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Args:
    dim = 16
    T = 100
    micro_bs = 8
    accum = 3
    epochs = 2
    n_per_rank = 12 * 8
    lr = 2e-3
    warmup = 3
    hold_temb = 3
    ema = 0.95
    seed = 11


def cosine_alpha_bar(T):
    s = 0.008
    t = torch.linspace(0, T, T + 1)
    f = torch.cos(((t / T) + s) / (1 + s) * math.pi / 2) ** 2
    return (f / f[0])[1:].clamp(1e-4, 1.0)


class NoisyPoints(Dataset):
    def __init__(self, n, args):
        g = torch.Generator().manual_seed(args.seed)
        centers = torch.randn(4, args.dim, generator=g) * 2
        self.x0 = centers[torch.randint(0, 4, (n,), generator=g)] + 0.3 * torch.randn(n, args.dim, generator=g)
        self.abar = cosine_alpha_bar(args.T)
        self.args = args

    def __len__(self):
        return self.x0.shape[0]

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.args.seed * 100003 + i)
        t = int(torch.randint(0, self.args.T, (1,), generator=g))
        eps = torch.randn(self.args.dim, generator=g)
        a = self.abar[t]
        xt = a.sqrt() * self.x0[i] + (1 - a).sqrt() * eps
        return xt, torch.tensor(t), eps


class Denoiser(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.temb = nn.Embedding(args.T, 64)
        self.inp = nn.Linear(args.dim, 64)
        self.net = nn.Sequential(nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, args.dim))

    def forward(self, xt, t):
        return self.net(self.inp(xt) + self.temb(t))


def main():
    args = Args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    net = Denoiser(args)
    model = DDP(net)
    ema = [p.detach().clone() for p in net.parameters()]
    temb_params = list(net.temb.parameters())
    other = [p for n, p in net.named_parameters() if not n.startswith("temb.")]
    opt = torch.optim.Adam([{"params": other}, {"params": temb_params}], lr=args.lr)
    warm = lambda s: min(1.0, (s + 1) / args.warmup)
    hold = lambda s: 0.0 if s < args.hold_temb else warm(s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [warm, hold])
    opt.register_step_post_hook(lambda optimizer, a, kw: sched.step())

    ds = NoisyPoints(args.n_per_rank * world, args)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.micro_bs, sampler=sampler, num_workers=1,
                        persistent_workers=True, drop_last=True)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (xt, t, eps) in enumerate(loader):
            boundary = (i + 1) % args.accum == 0
            with (contextlib.nullcontext() if boundary else model.no_sync()):
                loss = F.mse_loss(model(xt, t), eps) / args.accum
                loss.backward()
            if boundary:
                opt.step()
                opt.zero_grad(set_to_none=True)
                with torch.no_grad():
                    for e, p in zip(ema, net.parameters()):
                        e.lerp_(p, 1 - args.ema)
                step += 1
                if rank == 0 and step % 2 == 0:
                    print(f"step {step} epoch {epoch} loss {loss.item() * args.accum:.4f} lr {sched.get_last_lr()}", flush=True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
