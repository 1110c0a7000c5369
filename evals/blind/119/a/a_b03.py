"""Tabular regression trainer on DDP, config-driven, with a gradient-flow sanity check."""
import contextlib
import hashlib
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIG = json.loads("""
{
  "model": {"in_features": 20, "hidden": 64, "depth": 2},
  "optim": {"lr": 0.02, "momentum": 0.9, "nesterov": true},
  "train": {"micro_batch": 16, "accumulate": 2, "steps": 15, "seed": 99}
}
""")


def build_model(c):
    layers, d = [], c["in_features"]
    for _ in range(c["depth"]):
        layers += [nn.Linear(d, c["hidden"]), nn.Tanh()]
        d = c["hidden"]
    layers.append(nn.Linear(d, 1))
    return nn.Sequential(*layers)


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        t = cfg["train"]
        torch.manual_seed(t["seed"])
        self.model = DDP(build_model(cfg["model"]))
        self.opt = torch.optim.SGD(self.model.parameters(), **cfg["optim"])
        g = torch.Generator().manual_seed(t["seed"] + self.rank)
        n = t["steps"] * t["accumulate"]
        self.x = torch.randn(n, t["micro_batch"], cfg["model"]["in_features"], generator=g)
        w = torch.linspace(-1, 1, cfg["model"]["in_features"])
        self.y = (self.x @ w).sin().unsqueeze(-1) + 0.1 * torch.randn(n, t["micro_batch"], 1, generator=g)
        self.accum = t["accumulate"]

    def check_gradient_flow(self):
        """One backward on a probe batch; every parameter must receive a gradient."""
        out = self.model(self.x[0])
        F.mse_loss(out, self.y[0]).backward()
        dead = [n for n, p in self.model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
        if dead:
            raise RuntimeError(f"parameters without gradient: {dead}")

    def compute_loss(self, i):
        return F.mse_loss(self.model(self.x[i]), self.y[i]) / self.accum

    def fit(self):
        self.check_gradient_flow()
        for step in range(self.cfg["train"]["steps"]):
            for k in range(self.accum):
                i = step * self.accum + k
                ctx = self.model.no_sync() if k < self.accum - 1 else contextlib.nullcontext()
                with ctx:
                    self.compute_loss(i).backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    tr = Trainer(CONFIG)
    tr.fit()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {tr.sha()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
