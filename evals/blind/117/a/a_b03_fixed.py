"""DDP trainer class driven by a JSON config, stopped and resumed.

The run trains for `stop_after` optimizer steps, writes a checkpoint
(model, optimizer, scheduler), throws every object away, rebuilds the trainer
from the config, loads the checkpoint and trains to `total_steps`.  One
micro-step counter drives both the data position and the accumulation window.
"""
import hashlib
import json
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIG = json.loads("""
{
  "seed": 11,
  "model": {"in_dim": 20, "hidden": 64, "classes": 6},
  "data": {"micro_batch": 6},
  "optim": {"lr": 4e-3, "betas": [0.9, 0.95], "weight_decay": 0.05,
            "grad_accum": 3, "total_steps": 10, "warmup": 2},
  "checkpoint": {"stop_after": 5}
}
""")


class MLP(nn.Module):
    def __init__(self, in_dim, hidden, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(),
                                 nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def cosine_with_warmup(warmup, total):
    def f(s):
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
    return f


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        o = cfg["optim"]
        self.K = o["grad_accum"]
        torch.manual_seed(cfg["seed"])
        self.model = DDP(MLP(**cfg["model"]))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=o["lr"],
                                     betas=tuple(o["betas"]), weight_decay=o["weight_decay"])
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, cosine_with_warmup(o["warmup"], o["total_steps"]))
        self.micro_step = 0
        self.total_micro = o["total_steps"] * self.K
        # fixed per-rank stream of micro-batches
        g = torch.Generator().manual_seed(cfg["seed"] * 31 + rank)
        mb = cfg["data"]["micro_batch"]
        d = cfg["model"]["in_dim"]
        self.xs = torch.randn(self.total_micro, mb, d, generator=g)
        proj = torch.randn(d, cfg["model"]["classes"], generator=torch.Generator().manual_seed(3))
        self.ys = (self.xs @ proj).argmax(-1)

    @property
    def global_step(self):
        return self.sched.last_epoch

    def is_boundary(self):
        return (self.micro_step + 1) % self.K == 0

    def train_batch(self, x, y):
        ctx = self.model.no_sync() if not self.is_boundary() else _null()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / self.K
            loss.backward()
        if self.is_boundary():
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        self.micro_step += 1
        return loss.item()

    def run(self, until_step):
        while self.micro_step < self.total_micro and self.global_step < until_step:
            self.train_batch(self.xs[self.micro_step], self.ys[self.micro_step])

    def save(self, path):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(),
                        "optim": self.opt.state_dict(),
                        "sched": self.sched.state_dict()}, path)
        dist.barrier()

    def load(self, path):
        ck = torch.load(path, weights_only=False)
        self.model.module.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optim"])
        self.sched.load_state_dict(ck["sched"])
        # resume the data stream and the window where the checkpoint left off
        self.micro_step = self.global_step * self.K

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(tempfile.gettempdir(),
                        f"blind117a_b03_{os.environ.get('MASTER_PORT', '0')}.pt")
    tr = Trainer(CONFIG, rank, world)
    tr.run(CONFIG["checkpoint"]["stop_after"])
    tr.save(ckpt)
    del tr
    tr = Trainer(CONFIG, rank, world)
    tr.load(ckpt)
    dist.barrier()
    tr.run(CONFIG["optim"]["total_steps"])
    sha = tr.sha()
    if rank == 0:
        print(f"steps={tr.global_step} micro={tr.micro_step}")
        print(f"FINAL_SHA256 {sha}")
        os.remove(ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
