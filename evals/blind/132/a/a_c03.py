"""FSDP2 denoising autoencoder trainer, stopped and resumed.

fully_shard on each layer and the root; gradients are reduce-scattered after
every micro-batch (no deferred sync) and the sharded gradients accumulate
until the step. A fixed random projection inside the encoder is frozen.
Halfway through, the run saves model + optimizer with torch.distributed
.checkpoint, throws every object away and resumes into new ones.
"""
import hashlib
import os
import shutil
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

HP = SimpleNamespace(dim=24, code=8, micro_rows=4, accum=2, total_updates=12, stop_at=6,
                     lr=5e-3, clip=0.4, seed=31)


class AE(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.rand_proj = nn.Linear(hp.dim, hp.dim, bias=False)   # frozen
        self.enc = nn.Sequential(nn.Linear(hp.dim, 32), nn.Tanh(), nn.Linear(32, hp.code))
        self.dec = nn.Sequential(nn.Linear(hp.code, 32), nn.Tanh(), nn.Linear(32, hp.dim))

    def forward(self, x):
        return self.dec(self.enc(self.rand_proj(x)))


def micro_batch(hp, rank, idx):
    g = torch.Generator().manual_seed(hp.seed * 1000 + rank * 100_000 + idx)
    clean = torch.randn(hp.micro_rows, hp.dim, generator=g).cumsum(-1) / 3
    noisy = clean + 0.3 * torch.randn(hp.micro_rows, hp.dim, generator=g)
    return noisy, clean


def build(hp, mesh):
    torch.manual_seed(hp.seed)
    model = AE(hp)
    model.rand_proj.weight.requires_grad_(False)
    for m in (model.enc, model.dec):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=hp.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=hp.total_updates,
                                                       eta_min=hp.lr * 0.1)
    return model, opt, sched


def train_updates(hp, rank, model, opt, sched, first, last, stats):
    for update in range(first, last):
        for j in range(hp.accum):
            x, y = micro_batch(hp, rank, update * hp.accum + j)
            loss = nn.functional.mse_loss(model(x), y) / hp.accum
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        stats["clipped"] += int(norm > hp.clip)
        opt.step()
        sched.step()
        opt.zero_grad()


def main():
    torch.use_deterministic_algorithms(True)
    hp = HP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    ckpt = os.path.join(tempfile.gettempdir(), f"a_c03_dcp_{os.environ.get('MASTER_PORT', '0')}")
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
        os.makedirs(ckpt)
    dist.barrier()
    stats = {"clipped": 0}

    model, opt, sched = build(hp, mesh)
    train_updates(hp, rank, model, opt, sched, 0, hp.stop_at, stats)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    if rank == 0:
        torch.save(sched.state_dict(), os.path.join(ckpt, "sched.pt"))
    dist.barrier()
    del model, opt, sched, msd, osd

    model, opt, sched = build(hp, mesh)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sched.load_state_dict(torch.load(os.path.join(ckpt, "sched.pt")))
    train_updates(hp, rank, model, opt, sched, hp.stop_at, hp.total_updates, stats)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates {hp.total_updates} clip acted {stats['clipped']} lr {sched.get_last_lr()[0]:.2e}",
              flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)


if __name__ == "__main__":
    main()
