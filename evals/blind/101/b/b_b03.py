"""Sequence classifier on DDP with ZeroRedundancyOptimizer and no_sync accumulation.

The loop is split over small methods so the same runner can be subclassed for
other tasks. Gradient accumulation: K micro-batches per optimizer step, DDP's
all-reduce deferred to the last micro-batch of each window.
"""
import contextlib
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SETTINGS = dict(n_samples=240, seq=12, feat=10, classes=5, micro_bs=6,
                accum=4, epochs=2, lr=1e-3, seed=99)


class ConvClassifier(nn.Module):
    def __init__(self, feat, classes, width=32):
        super().__init__()
        self.conv1 = nn.Conv1d(feat, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, padding=1)
        self.norm = nn.LayerNorm(width)
        self.cls = nn.Linear(width, classes)

    def forward(self, x):  # x: B, T, F
        h = F.relu(self.conv1(x.transpose(1, 2)))
        h = F.relu(self.conv2(h)).mean(-1)
        return self.cls(self.norm(h))


class Runner:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg["seed"])
        g = torch.Generator().manual_seed(cfg["seed"])
        x = torch.randn(cfg["n_samples"], cfg["seq"], cfg["feat"], generator=g)
        y = (x[:, :, :cfg["classes"]].sum(1)).argmax(-1)
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=cfg["seed"], drop_last=True)
        self.loader = DataLoader(ds, batch_size=cfg["micro_bs"], sampler=self.sampler, drop_last=True)
        self.model = DDP(ConvClassifier(cfg["feat"], cfg["classes"]), gradient_as_bucket_view=True)
        self.opt = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=torch.optim.AdamW,
                                           lr=cfg["lr"], weight_decay=0.05)
        self.accum = cfg["accum"]
        self.global_step = 0
        self.micro_step = 0

    def sync_context(self):
        if (self.global_step + 1) % self.accum != 0:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def micro(self, xb, yb):
        with self.sync_context():
            loss = F.cross_entropy(self.model(xb), yb) / self.accum
            loss.backward()
        self.micro_step += 1
        return loss.item() * self.accum

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.global_step += 1

    def train(self):
        for epoch in range(self.cfg["epochs"]):
            self.sampler.set_epoch(epoch)
            for xb, yb in self.loader:
                loss = self.micro(xb, yb)
                if self.micro_step % self.accum == 0:
                    self.optimizer_step()
            if self.rank == 0:
                print(f"epoch {epoch} steps {self.global_step} last loss {loss:.4f}", flush=True)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    r = Runner(SETTINGS)
    r.train()
    d = r.final_digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
