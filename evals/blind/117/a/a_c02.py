"""FSDP2 trainer class: masked sequence labelling with 3-3-2 windows.

Every rank sees micro-batches with different numbers of labelled positions.
Each window (the last one is short) is normalised by the labelled count over
all its micro-batches on all ranks; the loss is a sum over that count times
the world size because FSDP2 averages the reduced gradient over ranks.  The
sync is deferred inside a window, the clip acts on the sharded gradients, and
the output head trains with its own SGD optimizer.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    seed: int = 3
    feat: int = 10
    dim: int = 32
    tags: int = 7
    seq: int = 9
    micro_batch: int = 4
    grad_accum: int = 3
    n_micro: int = 20          # windows of 3,3,3,3,3,3,2
    max_norm: float = 0.3
    lr_body: float = 3e-3
    lr_head: float = 5e-2


class Tagger(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.inp = nn.Linear(c.feat, c.dim)
        self.rnn_like = nn.Sequential(nn.Linear(c.dim, c.dim), nn.Tanh(), nn.LayerNorm(c.dim))
        self.mid = nn.Sequential(nn.Linear(c.dim, 2 * c.dim), nn.GELU(), nn.Linear(2 * c.dim, c.dim))
        self.head = nn.Linear(c.dim, c.tags)

    def forward(self, x):
        h = self.rnn_like(self.inp(x))
        h = h + self.mid(h)
        return self.head(h)


class FSDPTrainer:
    def __init__(self, c: Cfg):
        self.c = c
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        m = Tagger(c)
        fully_shard(m.mid)
        fully_shard(m.head)
        fully_shard(m)
        self.model = m
        head_ids = {id(p) for p in m.head.parameters()}
        body = [p for p in m.parameters() if id(p) not in head_ids]
        self.opt_body = torch.optim.AdamW(body, lr=c.lr_body, weight_decay=0.01)
        self.opt_head = torch.optim.SGD(m.head.parameters(), lr=c.lr_head, momentum=0.9)
        g = torch.Generator().manual_seed(c.seed * 97 + self.rank)
        self.x = torch.randn(c.n_micro, c.micro_batch, c.seq, c.feat, generator=g)
        w = torch.randn(c.feat, c.tags, generator=torch.Generator().manual_seed(1))
        self.y = (self.x @ w).argmax(-1)
        keep = torch.rand(c.n_micro, c.micro_batch, c.seq, generator=g) < (0.3 + 0.5 * self.rank)
        self.y[~keep] = -100

    def windows(self):
        K, n = self.c.grad_accum, self.c.n_micro
        for s in range(0, n, K):
            yield list(range(s, min(s + K, n)))

    def window_count(self, idx):
        cnt = (self.y[idx] != -100).sum().to(torch.float64)
        dist.all_reduce(cnt)
        return cnt

    def step_window(self, idx):
        count = self.window_count(idx)
        for j, i in enumerate(idx):
            last = j == len(idx) - 1
            self.model.set_requires_gradient_sync(last)
            logits = self.model(self.x[i])
            loss = F.cross_entropy(logits.reshape(-1, self.c.tags), self.y[i].reshape(-1),
                                   ignore_index=-100, reduction="sum")
            (loss * self.world / count).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.max_norm)
        self.opt_body.step()
        self.opt_head.step()
        self.opt_body.zero_grad(set_to_none=True)
        self.opt_head.zero_grad(set_to_none=True)
        return norm

    def fit(self):
        for w, idx in enumerate(self.windows()):
            norm = self.step_window(idx)
            if self.rank == 0 and w % 3 == 0:
                n = norm.full_tensor() if isinstance(norm, DTensor) else norm
                print(f"window {w} size {len(idx)} grad_norm {float(n):.4f}")

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    tr = FSDPTrainer(Cfg())
    tr.fit()
    s = tr.sha()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {s}")
    dist.destroy_process_group()
