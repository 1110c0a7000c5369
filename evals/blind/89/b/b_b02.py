"""DDP classifier trainer with a held-out gradient-norm probe for monitoring.

Launch with torchrun (2 ranks). Accumulates ACCUM micro-batches under
``no_sync`` and all-reduces on the last one. Every ``probe_every`` micro-steps
we log the gradient norm of a fixed held-out batch (a cheap generalisation
signal used by our dashboards).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class Cfg:
    accum: int = 4
    micro_bs: int = 8
    epochs: int = 3
    lr: float = 2e-3
    probe_every: int = 6
    n_train: int = 256
    d_in: int = 20
    n_cls: int = 5


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(cfg.d_in, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.cls = nn.Linear(64, cfg.n_cls)

    def forward(self, x):
        return self.cls(self.enc(x))


def grad_probe(module, batch):
    """Gradient norm of the held-out loss (monitoring only)."""
    x, y = batch
    loss = F.cross_entropy(module(x), y)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in module.parameters() if p.grad is not None))
    module.zero_grad(set_to_none=True)
    return norm.item()


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(0)
        self.model = DDP(Net(cfg), gradient_as_bucket_view=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        g = torch.Generator().manual_seed(99)
        x = torch.randn(cfg.n_train, cfg.d_in, generator=g)
        y = (x[:, :cfg.n_cls] * 2 + 0.3 * torch.randn(cfg.n_train, cfg.n_cls, generator=g)).argmax(-1)
        self.ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(self.ds, shuffle=True, seed=3)
        self.loader = DataLoader(self.ds, batch_size=cfg.micro_bs, sampler=self.sampler, drop_last=True)
        hx = torch.randn(32, cfg.d_in, generator=g)
        self.heldout = (hx, hx[:, :cfg.n_cls].argmax(-1))
        self.micro = 0
        self.updates = 0
        self.log = []

    def micro_step(self, batch, sync):
        x, y = batch
        ctx = self.model.no_sync() if not sync else torch.enable_grad()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / self.cfg.accum
            loss.backward()
        self.micro += 1
        if self.micro % self.cfg.probe_every == 0:
            self.log.append(grad_probe(self.model.module, self.heldout))
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1

    def fit(self):
        K = self.cfg.accum
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            for i, batch in enumerate(self.loader):
                last = (i + 1) % K == 0
                self.micro_step(batch, sync=last)
                if last:
                    self.optimizer_step()


def main():
    dist.init_process_group("gloo")
    t = Trainer(Cfg())
    t.fit()
    if t.rank == 0:
        h = hashlib.sha256()
        for _, p in t.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
