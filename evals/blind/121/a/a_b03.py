"""Intent classifier trained with DDP through a small in-house Trainer class.

Windows of K micro-batches; DDP's all-reduce is skipped (no_sync) on all but the
last micro-batch of a window.  An epoch of 11 micro-batches per rank ends in a
3-batch window, which is stepped as its own (shorter) window.
"""
import argparse
import hashlib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class Config:
    seed: int = 7
    n_samples: int = 2 * 11 * 6   # 11 micro-batches of 6 per rank per epoch
    n_features: int = 24
    n_classes: int = 5
    micro_batch: int = 6
    accum: int = 4
    epochs: int = 2
    lr: float = 1e-2


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.n_features, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.cls = nn.Linear(48, cfg.n_classes)

    def forward(self, x):
        return self.cls(self.body(x))


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        self.model = DDP(Net(cfg))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        g = torch.Generator().manual_seed(cfg.seed + 1)
        x = torch.randn(cfg.n_samples, cfg.n_features, generator=g)
        y = (x[:, :cfg.n_classes] * 2 + 0.5 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=self.sampler)
        self.updates = 0

    def window_len(self, idx):
        n, K = len(self.loader), self.cfg.accum
        start = (idx // K) * K
        return min(K, n - start)

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        K = self.cfg.accum
        for idx, (x, y) in enumerate(self.loader):
            boundary = (idx + 1) % K == 0
            ctx = nullcontext() if boundary else self.model.no_sync()
            with ctx:
                loss = F.cross_entropy(self.model(x), y) / self.window_len(idx)
                loss.backward()
            if boundary:
                self.optimizer_step()
        # the epoch's leftover micro-batches form a short window of their own
        if len(self.loader) % K:
            self.optimizer_step()

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.train_epoch(epoch)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=Config.accum)
    ap.add_argument("--epochs", type=int, default=Config.epochs)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(Config(accum=args.accum, epochs=args.epochs))
    trainer.fit()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"updates {trainer.updates}")
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
