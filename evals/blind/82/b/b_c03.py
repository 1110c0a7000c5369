"""DDP + torch ZeroRedundancyOptimizer on 2 CPU ranks, preempted and resumed.

The run is cut in two phases the way a preemptible job sees it: phase 1 trains to
SAVE_AT optimizer steps and writes a checkpoint (model, consolidated ZeRO optimizer
state, scheduler, step); phase 2 builds every object anew (a different random init,
so the load is what counts), restores the checkpoint and goes on from the same
window of the same epoch. DataLoader worker processes feed both phases.
"""
import hashlib
import itertools
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass(frozen=True)
class Settings:
    features: int = 16
    hidden: int = 64
    classes: int = 5
    micro_batch: int = 4
    accumulation: int = 3
    windows_per_epoch: int = 8
    epochs: int = 2
    save_at: int = 6
    lr: float = 2e-3
    seed: int = 3
    workers: int = 1


S = Settings()


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(S.features, S.hidden), nn.LayerNorm(S.hidden), nn.ReLU(),
            nn.Linear(S.hidden, S.hidden), nn.ReLU(),
            nn.Linear(S.hidden, S.classes),
        )

    def forward(self, x):
        return self.net(x)


def dataset(world):
    n = world * S.windows_per_epoch * S.accumulation * S.micro_batch
    g = torch.Generator().manual_seed(S.seed + 10)
    centers = 2.0 * torch.randn(S.classes, S.features, generator=g)
    y = torch.randint(0, S.classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, S.features, generator=g)
    return TensorDataset(x, y)


def lr_lambda(step):
    total = S.windows_per_epoch * S.epochs
    return 0.5 * (1.0 + math.cos(math.pi * step / total))


def build(rank, world, init_seed):
    torch.manual_seed(init_seed)
    ddp = DDP(Classifier())
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=S.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    data = dataset(world)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=S.seed)
    loader = DataLoader(data, batch_size=S.micro_batch, sampler=sampler,
                        num_workers=S.workers, drop_last=True)
    return ddp, opt, sched, sampler, loader


def train_phase(rank, world, ckpt_dir, start, stop, init_seed):
    ddp, opt, sched, sampler, loader = build(rank, world, init_seed)
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if start > 0:
        state = torch.load(path, weights_only=False)
        ddp.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        assert state["step"] == start

    step = start
    while step < stop:
        epoch, window_in_epoch = divmod(step, S.windows_per_epoch)
        sampler.set_epoch(epoch)
        batches = itertools.islice(iter(loader), window_in_epoch * S.accumulation, None)
        for i, (x, y) in enumerate(batches):
            boundary = (i + 1) % S.accumulation == 0
            if boundary:
                loss = F.cross_entropy(ddp(x), y) / S.accumulation
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step == stop:
                    break
            else:
                with ddp.no_sync():
                    loss = F.cross_entropy(ddp(x), y) / S.accumulation
                    loss.backward()
        if rank == 0:
            print(f"phase[{start}->{stop}] epoch {epoch} step {step} loss {loss.item() * S.accumulation:.4f}")

    if stop == S.save_at:
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": ddp.module.state_dict(), "optim": opt.state_dict(),
                        "sched": sched.state_dict(), "step": step}, path)
        dist.barrier()
    return ddp


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    holder = [tempfile.mkdtemp(prefix="zero_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    total = S.windows_per_epoch * S.epochs
    train_phase(rank, world, ckpt_dir, 0, S.save_at, init_seed=S.seed)
    ddp = train_phase(rank, world, ckpt_dir, S.save_at, total, init_seed=S.seed + 999)

    h = hashlib.sha256()
    for _, p in ddp.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
