"""DDP trainer with an auxiliary reconstruction head that only runs on some micro-batches.

The auxiliary decoder is evaluated on the first K-1 micro-batches of each window
(they run under no_sync); the last micro-batch, which carries the all-reduce, only
uses the main head. DDP is built with find_unused_parameters=True and bucket views.
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


@dataclass
class Settings:
    d_in: int = 16
    hidden: int = 48
    micro: int = 5
    accum: int = 3
    steps: int = 12
    lr: float = 3e-3
    aux_weight: float = 0.3
    seed: int = 21


class AutoRegressor(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(s.d_in, s.hidden), nn.SiLU(), nn.Linear(s.hidden, s.hidden))
        self.head = nn.Linear(s.hidden, 1)
        self.decoder = nn.Linear(s.hidden, s.d_in)

    def forward(self, x, with_aux):
        z = torch.tanh(self.enc(x))
        out = self.head(z).squeeze(-1)
        recon = self.decoder(z) if with_aux else None
        return out, recon


class Trainer:
    def __init__(self, s: Settings):
        self.s = s
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(s.seed)
        self.net = AutoRegressor(s)
        self.model = DDP(self.net, find_unused_parameters=True, gradient_as_bucket_view=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=s.lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(s.seed + 1)
        n = s.steps * s.accum * s.micro * self.world
        self.x = torch.randn(n, s.d_in, generator=g)
        self.y = self.x[:, :4].sum(1) * torch.cos(self.x[:, 4]) + 0.05 * torch.randn(n, generator=g)

    def micro_batch(self, idx):
        s = self.s
        lo = (idx * self.world + self.rank) * s.micro
        return self.x[lo:lo + s.micro], self.y[lo:lo + s.micro]

    def micro_step(self, idx, sync):
        s = self.s
        use_aux = not sync
        x, y = self.micro_batch(idx)
        with (nullcontext() if sync else self.model.no_sync()):
            pred, recon = self.model(x, use_aux)
            loss = F.mse_loss(pred, y)
            if use_aux:
                loss = loss + s.aux_weight * F.mse_loss(recon, x)
            (loss / s.accum).backward()

    def fit(self):
        s = self.s
        for step in range(s.steps):
            for k in range(s.accum):
                self.micro_step(step * s.accum + k, sync=(k == s.accum - 1))
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)

    def digest(self):
        h = hashlib.sha256()
        flat = []
        for _, p in self.net.named_parameters():
            t = p.detach().to(torch.float32).contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        return h.hexdigest(), torch.cat(flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    t = Trainer(Settings())
    t.fit()
    d, flat = t.digest()
    if t.rank == 0:
        if args.dump:
            torch.save(flat, args.dump)
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
