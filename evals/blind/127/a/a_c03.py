"""FSDP2 trainer: a sharded encoder (AdamW) and a head (SGD + Nesterov) in one
root unit, sync and reshard deferred until each window's last micro-step,
epochs of 10 micro-batches at K = 4 (windows 4-4-2, each averaged over its own
length), one global clip over both optimizers' parameters."""
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class Opts:
    seed: int = 314
    dim: int = 20
    width: int = 48
    micro: int = 6
    accum: int = 4
    micro_per_epoch: int = 10
    epochs: int = 2
    enc_lr: float = 2e-3
    head_lr: float = 0.05
    clip: float = 0.3


class Encoder(nn.Module):
    def __init__(self, o):
        super().__init__()
        self.l1 = nn.Linear(o.dim, o.width)
        self.l2 = nn.Linear(o.width, o.width)
        self.ln = nn.LayerNorm(o.width)

    def forward(self, x):
        return self.ln(F.silu(self.l2(F.silu(self.l1(x)))))


class Model(nn.Module):
    def __init__(self, o):
        super().__init__()
        self.encoder = Encoder(o)
        self.head = nn.Linear(o.width, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def make_epoch(o, epoch, rank, world):
    g = torch.Generator().manual_seed(o.seed * 100 + epoch)
    n = o.micro_per_epoch * world
    x = torch.randn(n, o.micro, o.dim, generator=g)
    y = torch.randn(n, o.micro, 3, generator=g) * 0.1 + x[..., :3].cos()
    return list(zip(x[rank::world], y[rank::world]))


class Runner:
    def __init__(self, o):
        self.o = o
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(o.seed)
        m = Model(o)
        fully_shard(m.encoder)
        fully_shard(m)
        self.model = m
        self.enc_opt = torch.optim.AdamW(m.encoder.parameters(), lr=o.enc_lr, weight_decay=0.0)
        self.head_opt = torch.optim.SGD(m.head.parameters(), lr=o.head_lr, momentum=0.9,
                                        nesterov=True)

    def _set_deferral(self, final):
        self.model.set_requires_gradient_sync(final)
        self.model.set_reshard_after_backward(final)

    def window(self, batches):
        n = len(batches)
        for j, (x, y) in enumerate(batches):
            self._set_deferral(j == n - 1)
            loss = F.smooth_l1_loss(self.model(x), y) / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.model.parameters()), self.o.clip)
        self.enc_opt.step()
        self.head_opt.step()
        self.enc_opt.zero_grad()
        self.head_opt.zero_grad()

    def fit(self):
        K = self.o.accum
        for ep in range(self.o.epochs):
            data = make_epoch(self.o, ep, self.rank, self.world)
            for s in range(0, len(data), K):
                self.window(data[s:s + K])

    def digest(self):
        flat = torch.cat([p.full_tensor().detach().float().reshape(-1)
                          for _, p in self.model.named_parameters()])
        return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    r = Runner(Opts())
    r.fit()
    h = r.digest()
    if r.rank == 0:
        print(f"FINAL_SHA256 {h}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
