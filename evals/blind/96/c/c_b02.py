#!/usr/bin/env python
# Multi-task regression + classification with homoscedastic uncertainty weighting
# (Kendall, Gal & Cipolla 2018).  Two ranks started with mp.spawn, gradients averaged
# by hand (one flat all-reduce per window), trainer split over small hook methods.
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def get_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, default=49221)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weighting-lr", type=float, default=2e-2)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


class TwoHeadNet(nn.Module):
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


class SyntheticTasks:
    def __init__(self, seed, rank):
        g = torch.Generator().manual_seed(seed)
        self.w_reg = torch.randn(16, generator=g)
        self.w_cls = torch.randn(16, 5, generator=g)
        self.g = torch.Generator().manual_seed(seed * 31 + rank)

    def batch(self, n):
        x = torch.randn(n, 16, generator=self.g)
        y_reg = x @ self.w_reg + 0.5 * torch.randn(n, generator=self.g)
        y_cls = (x @ self.w_cls).argmax(-1)
        return x, y_reg, y_cls


class MultiTaskTrainer:
    def __init__(self, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        torch.manual_seed(args.seed)
        self.model = TwoHeadNet()
        self.weighting = UncertaintyWeighting(2)
        self.optimizer = torch.optim.Adam([
            {"params": self.model.parameters(), "lr": args.lr},
            {"params": self.weighting.parameters(), "lr": args.weighting_lr},
        ])
        self.data = SyntheticTasks(args.seed, rank)
        self.micro_step = 0
        self.global_step = 0

    # ---- hooks -------------------------------------------------------------
    def training_step(self, batch):
        x, y_reg, y_cls = batch
        pred_reg, logits = self.model(x)
        losses = [F.mse_loss(pred_reg, y_reg), F.cross_entropy(logits, y_cls)]
        return self.weighting(losses)

    def backward(self, loss):
        (loss / self.args.accum).backward()

    def all_reduce_gradients(self):
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world
        off = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[off:off + n].view_as(p.grad))
            off += n

    def on_before_optimizer_step(self):
        self.all_reduce_gradients()

    def optimizer_step(self):
        self.on_before_optimizer_step()
        self.optimizer.step()
        self.global_step += 1
        self.on_after_optimizer_step()

    def on_after_optimizer_step(self):
        self.model.zero_grad(set_to_none=True)

    # ---- loop --------------------------------------------------------------
    def fit(self):
        a = self.args
        while self.global_step < a.steps:
            loss = self.training_step(self.data.batch(a.micro_bs))
            self.backward(loss)
            self.micro_step += 1
            if self.micro_step % a.accum == 0:
                self.optimizer_step()
                if self.rank == 0 and self.global_step % 5 == 0:
                    print(f"step {self.global_step} loss {loss.item():.4f} "
                          f"log_vars {self.weighting.log_vars.data.tolist()}", flush=True)


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    trainer = MultiTaskTrainer(args, rank, args.world_size)
    trainer.fit()
    digest = hashlib.sha256()
    for _, p in trainer.model.named_parameters():
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    for _, p in trainer.weighting.named_parameters():
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {digest.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)
