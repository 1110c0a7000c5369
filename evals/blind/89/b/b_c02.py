"""ZeRO-3 DeepSpeed run split in two phases with an engine checkpoint.

Phase 1 trains one epoch and writes an engine checkpoint (model shards,
optimizer and client scheduler). Phase 2 builds a brand-new model, optimizer,
scheduler and engine, loads the checkpoint and trains the second epoch, as a
job restarted after preemption would. The input projection is frozen; the
engine owns accumulation (GA 2) and clips at 0.3 (asked for explicitly).
"""
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "ckpt_b_c02")
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.3,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 10 ** 9,
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(10, 24)
        self.proj.requires_grad_(False)
        self.trunk = nn.Sequential(nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh())
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        return self.head(self.trunk(self.proj(x)))


def build(total_updates):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 4) * max(0.1, 1 - s / total_updates))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=DS_CONFIG)
    return engine


def run_epoch(engine, loader, sampler, epoch):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(21)
    x = torch.randn(192, 10, generator=g)
    y = (x[:, :4] + 0.5 * torch.randn(192, 4, generator=g)).argmax(-1)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, shuffle=True, seed=4)
    loader = DataLoader(ds, batch_size=DS_CONFIG["train_micro_batch_size_per_gpu"], sampler=sampler)
    per_update = DS_CONFIG["train_micro_batch_size_per_gpu"] * DS_CONFIG["gradient_accumulation_steps"] * world
    total_updates = 2 * len(ds) // per_update

    engine = build(total_updates)
    run_epoch(engine, loader, sampler, 0)
    engine.save_checkpoint(CKPT, tag="epoch0")
    dist.barrier()
    del engine

    engine = build(total_updates)
    load_path, _ = engine.load_checkpoint(CKPT, tag="epoch0")
    assert load_path is not None, "checkpoint not found"
    run_epoch(engine, loader, sampler, 1)

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        if rank == 0:
            h = hashlib.sha256()
            for _, p in engine.module.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT, ignore_errors=True)


if __name__ == "__main__":
    main()
