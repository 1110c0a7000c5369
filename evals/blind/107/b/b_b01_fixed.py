"""DDP regression trainer: fp16 autocast + GradScaler, an AdamW body and an SGD head.

Launched with torchrun (2 ranks).  Gradient accumulation over K micro-batches with
DDP's no_sync on all but the last micro-batch of each window; the global-norm clip
runs once per window, after unscaling.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr-body", type=float, default=3e-3)
    p.add_argument("--lr-head", type=float, default=5e-2)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hid=64, d_out=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hid), nn.GELU(), nn.Linear(d_hid, d_hid), nn.GELU())
        self.head = nn.Linear(d_hid, d_out)

    def forward(self, x):
        return self.head(self.body(x))


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = torch.tanh(x @ w) * 3.0 + 0.1 * torch.randn(n, 4, generator=g)
    return x, y


class Trainer:
    def __init__(self, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        torch.manual_seed(args.seed)
        model = Regressor()
        self.model = DDP(model)
        self.opt = torch.optim.AdamW(model.body.parameters(), lr=args.lr_body, weight_decay=0.01)
        self.head_opt = torch.optim.SGD(model.head.parameters(), lr=args.lr_head, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        n = args.steps * args.grad_accum * args.micro_bs * world
        self.x, self.y = make_data(n, args.seed + 1)

    def micro_batch(self, step, k):
        a = self.args
        idx = ((step * a.grad_accum + k) * self.world + self.rank) * a.micro_bs
        return self.x[idx: idx + a.micro_bs], self.y[idx: idx + a.micro_bs]

    def _unscale_and_clip(self):
        # bring gradients back to their true scale before clipping
        self.scaler.unscale_(self.opt)
        self.scaler.unscale_(self.head_opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)

    def _step(self):
        self._unscale_and_clip()
        self.scaler.step(self.opt)
        self.scaler.step(self.head_opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)

    def train(self):
        K = self.args.grad_accum
        for step in range(self.args.steps):
            for k in range(K):
                x, y = self.micro_batch(step, k)
                ctx = self.model.no_sync() if k < K - 1 else contextlib.nullcontext()
                with ctx:
                    with torch.autocast("cpu", dtype=torch.float16):
                        pred = self.model(x)
                        loss = F.mse_loss(pred.float(), y)
                    self.scaler.scale(loss / K).backward()
            self._step()

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    tr = Trainer(args, rank, world)
    tr.train()
    sha = tr.final_sha()
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
