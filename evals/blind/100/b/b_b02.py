"""FSDP2 (fully_shard) language-model fine-tune with a warm-up + cosine schedule.

Blocks and the root are separate FSDP units; gradient sync is deferred to the
last micro-batch of each accumulation window.
"""
import argparse
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--n-samples", type=int, default=96)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-frac", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(2)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids)
        for b in self.blocks:
            h = b(h)
        return self.lm_head(self.ln_f(h))


def make_dataset(args):
    g = torch.Generator().manual_seed(args.seed)
    start = torch.randint(0, args.vocab, (args.n_samples, 1), generator=g)
    step = torch.randint(1, 5, (args.n_samples, 1), generator=g)
    ids = (start + step * torch.arange(args.seq + 1)) % args.vocab
    return TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())


def warmup_cosine(total_steps, warmup_steps):
    def f(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        prog = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, prog)))
    return f


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)

    ds = make_dataset(args)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.micro_bs, sampler=sampler, drop_last=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    total_steps = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(total_steps, int(args.warmup_frac * total_steps)))

    K = args.grad_accum
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % K == 0
            model.set_requires_gradient_sync(last)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)) / K
            loss.backward()
            if last:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)

    full = [(n, p.full_tensor()) for n, p in model.named_parameters()]
    if rank == 0:
        report(full)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
