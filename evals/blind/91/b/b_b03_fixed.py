"""DDP training of a small VQ-style autoencoder with gradient accumulation (no_sync).

The codebook is kept out of DDP's buckets (it is only touched by the quantiser, outside the
encoder/decoder path) and its gradient is synchronised by hand once per window.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4            # micro-batches per optimizer step
MICRO_BS = 8
STEPS = 12
BETA = 0.25


class VQAE(nn.Module):
    def __init__(self, d_in=24, d_lat=8, n_codes=16):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_lat))
        self.dec = nn.Sequential(nn.Linear(d_lat, 32), nn.ReLU(), nn.Linear(32, d_in))
        self.codebook = nn.Parameter(torch.randn(n_codes, d_lat) * 0.5)

    def quantise(self, z):
        d = torch.cdist(z, self.codebook)
        idx = d.argmin(-1)
        q = self.codebook[idx]
        codebook_loss = F.mse_loss(q, z.detach())
        commit_loss = F.mse_loss(z, q.detach())
        q_st = z + (q - z).detach()
        return q_st, codebook_loss, commit_loss

    def forward(self, x):
        z = self.enc(x)
        q, cb, cm = self.quantise(z)
        return self.dec(q), cb, cm


def sync_codebook_grad(module):
    g = module.codebook.grad
    dist.all_reduce(g, op=dist.ReduceOp.SUM)
    g.div_(dist.get_world_size())


def window_batches(rank, steps):
    g = torch.Generator().manual_seed(31 + rank)
    centres = torch.randn(6, 24, generator=torch.Generator().manual_seed(5))
    for _ in range(steps):
        win = []
        for _ in range(K):
            c = centres[torch.randint(0, 6, (MICRO_BS,), generator=g)]
            win.append(c + 0.2 * torch.randn(MICRO_BS, 24, generator=g))
        yield win


def params_sha(model):
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = VQAE()
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["codebook"])
    model = DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    for window in window_batches(rank, STEPS):
        for j, x in enumerate(window):
            ctx = model.no_sync() if j < K - 1 else nullcontext()
            with ctx:
                recon, cb, cm = model(x)
                loss = F.mse_loss(recon, x) + cb + BETA * cm
                (loss / K).backward()
        sync_codebook_grad(net)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sha = params_sha(net)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
