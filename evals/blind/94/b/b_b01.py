"""ZeRO-2 regression trainer with a cosine schedule configured in the DeepSpeed config.

Launch with torchrun; DeepSpeed picks up the rendezvous from the environment.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.distributed as dist
import deepspeed
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class RunConfig:
    seed: int = 1234
    n_samples: int = 256
    in_dim: int = 16
    hidden: int = 64
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 3e-3
    warmup_steps: int = 3
    weight_decay: float = 0.01
    clip: float = 0.0  # no clipping
    extra: dict = field(default_factory=dict)


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg.n_samples, 1, generator=g)
    return TensorDataset(x, y)


def build_model(cfg):
    return nn.Sequential(
        nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
        nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(),
        nn.Linear(cfg.hidden, 1),
    )


def optimizer_steps_total(cfg, dataset):
    # number of optimizer updates over the whole run
    micro_batches_per_epoch = len(dataset) // cfg.micro_batch
    return cfg.epochs * micro_batches_per_epoch // cfg.grad_accum


def ds_config(cfg, world_size, total_steps):
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world_size,
        "gradient_clipping": cfg.clip,
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": total_steps,
                "warmup_num_steps": cfg.warmup_steps,
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": 0.05,
                "warmup_type": "linear",
            },
        },
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def main():
    cfg = RunConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)

    data = make_data(cfg)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(data, batch_size=cfg.micro_batch, sampler=sampler, drop_last=True)

    model = build_model(cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = optimizer_steps_total(cfg, data)
    engine, _, _, sched = deepspeed.initialize(
        model=model, optimizer=optim, config=ds_config(cfg, world, total)
    )

    loss_fn = nn.MSELoss()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
    if rank == 0:
        print(f"done: {engine.global_steps} optimizer steps, lr {sched.get_last_lr()[0]:.6f}")

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
