"""Set-to-vector regression on FSDP2 with spawned ranks (`python b_c02.py`).

Micro-batches have 2..7 samples, so the window's loss is a sum over samples
divided by the window's sample count over all ranks; FSDP2 is told to sum
(divide factor 1). An epoch holds 11 micro-batches, so its last window is 3
long. A frozen final-norm scale, and a global-norm clip on the sharded grads.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.fsdp import fully_shard, FSDPModule, MixedPrecisionPolicy


@dataclass
class Cfg:
    port: int = 49161
    world: int = 2
    accum: int = 4
    micro_per_epoch: int = 11
    epochs: int = 2
    lr: float = 1e-3
    clip: float = 0.3
    d: int = 16


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(3)])
        self.norm = nn.LayerNorm(d)
        self.norm.weight.requires_grad_(False)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h))


def shard(model):
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)   # gloo has no PREMUL_SUM
    return model


def epoch_data(cfg, rank, epoch):
    g = torch.Generator().manual_seed(9000 + 31 * epoch + rank)
    A = torch.randn(cfg.d, 3, generator=torch.Generator().manual_seed(5))
    out = []
    for _ in range(cfg.micro_per_epoch):
        n = int(torch.randint(2, 8, (1,), generator=g))
        x = torch.randn(n, cfg.d, generator=g)
        out.append((x, torch.sin(x @ A)))
    return out


def windows(seq, k):
    for s in range(0, len(seq), k):
        yield seq[s:s + k]


def worker(rank, cfg):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg.port}",
                            rank=rank, world_size=cfg.world)
    torch.manual_seed(0)
    model = shard(Net(cfg.d))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)

    updates = 0
    for epoch in range(cfg.epochs):
        for win in windows(epoch_data(cfg, rank, epoch), cfg.accum):
            n = torch.tensor([float(sum(x.shape[0] for x, _ in win))])
            dist.all_reduce(n)
            for j, (x, y) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                loss = (model(x) - y).pow(2).sum(-1).sum() / n.item()
                loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            opt.zero_grad()
            updates += 1
            if rank == 0 and updates % 3 == 0:
                print(f"update {updates} grad_norm {gn.full_tensor().item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = Cfg()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world, join=True)
