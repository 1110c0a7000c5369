"""DDP regression trainer with gradient accumulation, written as a small
Trainer class (setup / micro-step / optimizer-step split over methods)."""
import argparse
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class ResidualMLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=48):
        super().__init__()
        self.inp = nn.Linear(d_in, d_hidden)
        self.block = nn.Sequential(nn.LayerNorm(d_hidden), nn.Linear(d_hidden, d_hidden), nn.GELU())
        self.head = nn.Linear(d_hidden, 1)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.block(h)
        return self.head(h).squeeze(-1)


class Trainer:
    def __init__(self, args):
        self.args = args
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = DDP(ResidualMLP())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr,
                                         momentum=args.momentum)
        self.micro_step = 0
        self.updates_done = 0
        gen = torch.Generator().manual_seed(args.seed + 1000 * self.rank)
        self._gen = gen
        self._w_true = torch.linspace(-1, 1, 16)

    # ---- data -------------------------------------------------------------
    def next_batch(self):
        x = torch.randn(self.args.micro_batch, 16, generator=self._gen)
        y = torch.sin(x @ self._w_true) + 0.1 * torch.randn(self.args.micro_batch, generator=self._gen)
        return x, y

    # ---- accumulation bookkeeping ----------------------------------------
    def at_boundary(self):
        return (self.micro_step + 1) % self.args.accum_steps == 0

    def sync_context(self):
        return nullcontext() if self.at_boundary() else self.model.no_sync()

    # ---- steps ------------------------------------------------------------
    def micro(self, batch):
        x, y = batch
        with self.sync_context():
            pred = self.model(x)
            loss = nn.functional.mse_loss(pred, y) / self.args.accum_steps
            loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates_done += 1

    def fit(self):
        total_micro = self.args.updates * self.args.accum_steps
        for _ in range(total_micro):
            loss = self.micro(self.next_batch())
            if self.at_boundary:
                self.optimizer_step()
            self.micro_step += 1
        if self.rank == 0:
            print(f"micro-steps {self.micro_step} updates {self.updates_done}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(parse_args())
    trainer.fit()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
