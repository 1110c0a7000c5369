"""ZeRO-3 with one coalesced gradient reduction per accumulation window, a
client two-group AdamW and warm-up schedule, and a mid-run checkpoint reloaded
into a freshly built engine (simulated preemption after update 6).
"""
import hashlib
import os
import shutil
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

K = 2
MICRO_BS = 5
TOTAL_UPDATES = 12
PREEMPT_AT = 6
CFG = {
    "train_micro_batch_size_per_gpu": MICRO_BS,
    "gradient_accumulation_steps": K,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 100000,
}


class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 8))
        self.dec = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 24))

    def forward(self, x):
        return self.dec(self.enc(x))


def build_engine():
    torch.manual_seed(0)
    model = AE()
    groups = [
        {"params": list(model.enc.parameters()), "lr": 2e-3, "weight_decay": 0.0},
        {"params": list(model.dec.parameters()), "lr": 1e-3, "weight_decay": 0.02},
    ]
    opt = torch.optim.AdamW(groups)
    sched = LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=CFG)
    return engine


def micro_batches(rank):
    g = torch.Generator().manual_seed(2024)
    x = torch.randn(2, TOTAL_UPDATES * K, MICRO_BS, 24, generator=g)
    return list(x[rank])


def train_updates(engine, data, start, stop):
    for u in range(start, stop):
        window = data[u * K:(u + 1) * K]
        with engine.coalesce_grad_reduction():
            for x in window:
                loss = F.mse_loss(engine(x), x)
                engine.backward(loss)
        for _ in window:
            engine.step()
        if dist.get_rank() == 0 and (u + 1) % 3 == 0:
            print(f"update {engine.global_steps} lr {engine.get_lr()[0]:.2e} loss {loss.item():.4f}", flush=True)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    holder = [tempfile.mkdtemp(prefix="b_c02_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]
    data = micro_batches(rank)

    engine = build_engine()
    train_updates(engine, data, 0, PREEMPT_AT)
    engine.save_checkpoint(ckpt_dir, tag="preempt")
    del engine

    engine = build_engine()
    engine.load_checkpoint(ckpt_dir, tag="preempt")
    start = engine.global_steps
    train_updates(engine, data, start, TOTAL_UPDATES)

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
