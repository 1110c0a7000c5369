"""Multi-label tagger on 2 DDP ranks, trainer class with a worker DataLoader.

K = 4, 10 equal micro-batches per rank per epoch, so windows are 4-4-2; each window's
loss is divided by the window's own length. no_sync() on all but the last backward of a
window, bf16 autocast for the forward, two optimizers (AdamW body, SGD head) with their
own StepLR, one clip (1.0) over all parameters at the boundary.
"""
import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass
class Cfg:
    n_items: int = 120
    feat: int = 20
    tags: int = 6
    micro_bs: int = 6
    accum: int = 4
    epochs: int = 2
    body_lr: float = 2e-3
    head_lr: float = 0.1
    clip: float = 1.0
    seed: int = 5


class TagData(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randn(cfg.n_items, cfg.feat, generator=g)
        proj = torch.randn(cfg.feat, cfg.tags, generator=g)
        self.y = (self.x @ proj > 0.3).float()

    def __len__(self):
        return self.x.size(0)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.feat, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.head = nn.Linear(48, cfg.tags)

    def forward(self, x):
        return self.head(self.body(x))


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        self.model = DDP(Tagger(cfg))
        core = self.model.module
        self.opts = [torch.optim.AdamW(core.body.parameters(), lr=cfg.body_lr),
                     torch.optim.SGD(core.head.parameters(), lr=cfg.head_lr, momentum=0.5)]
        self.scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.7) for o in self.opts]
        ds = TagData(cfg)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(ds, batch_size=cfg.micro_bs, sampler=self.sampler,
                                 num_workers=1, persistent_workers=False)
        self.global_step = 0

    def _window_len(self, i, n):
        start = (i // self.cfg.accum) * self.cfg.accum
        return min(self.cfg.accum, n - start)

    def _optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        for o in self.opts:
            o.step()
        for s in self.scheds:
            s.step()
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        self.global_step += 1

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        n = len(self.loader)
        for i, (x, y) in enumerate(self.loader):
            wlen = self._window_len(i, n)
            last_in_window = (i % self.cfg.accum == wlen - 1)
            ctx = nullcontext() if last_in_window else self.model.no_sync()
            with ctx:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = self.model(x)
                loss = F.binary_cross_entropy_with_logits(logits.float(), y)
                (loss / wlen).backward()
            if last_in_window:
                self._optimizer_step()
        return loss.item()

    def fit(self):
        for ep in range(self.cfg.epochs):
            last = self.train_epoch(ep)
            if self.rank == 0:
                print(f"epoch {ep} last loss {last:.4f} steps {self.global_step}", flush=True)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    t = Trainer(Cfg())
    t.fit()
    d = t.sha()
    if t.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
