"""ZeRO-2 regression trainer with preemption-safe checkpoints.

Phase 1 trains until `stop_after_steps` optimizer steps and checkpoints on a
window boundary; phase 2 builds a brand-new engine, loads the checkpoint and
finishes the run.  Gradient accumulation is owned by the engine (GA = K).
"""
import hashlib, os, shutil
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.distributed as dist
import deepspeed


@dataclass
class Cfg:
    micro_bs: int = 8
    grad_accum: int = 4
    total_micro: int = 40          # micro-batches per rank -> 10 optimizer steps
    stop_after_steps: int = 4
    lr: float = 3e-3
    ckpt_dir: str = "tmp_scratch/a_b01_fixed_ckpt"


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_h=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_h), nn.GELU(), nn.Linear(d_h, d_h), nn.GELU(), nn.Linear(d_h, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def make_data(cfg, rank):
    g = torch.Generator().manual_seed(1234 + rank)
    xs = torch.randn(cfg.total_micro, cfg.micro_bs, 16, generator=g)
    w = torch.linspace(-1, 1, 16)
    ys = torch.sin(xs @ w) + 0.1 * torch.randn(cfg.total_micro, cfg.micro_bs, generator=g)
    return list(zip(xs, ys))


def ds_config(cfg, world):
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_bs,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_bs * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": 0.01}},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }


def build_engine(cfg):
    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    conf = ds_config(cfg, dist.get_world_size())
    conf.pop("optimizer")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=conf)
    return engine


def run(engine, data, start, cfg, stop_at=None):
    """Train from micro-batch `start`; return the index to resume from, or None if finished."""
    for i in range(start, len(data)):
        x, y = data[i]
        loss = nn.functional.mse_loss(engine(x), y)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.backward(loss)
        engine.step()
        if stop_at is not None and boundary and engine.global_steps == stop_at:
            engine.save_checkpoint(cfg.ckpt_dir, tag="preempt", client_state={"next_micro": i + 1})
            return i + 1
    return None


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    cfg = Cfg()
    if rank == 0:
        shutil.rmtree(cfg.ckpt_dir, ignore_errors=True)
    dist.barrier()
    data = make_data(cfg, rank)

    engine = build_engine(cfg)
    run(engine, data, 0, cfg, stop_at=cfg.stop_after_steps)
    del engine
    dist.barrier()

    engine = build_engine(cfg)  # fresh engine, as after a restart
    _, client = engine.load_checkpoint(cfg.ckpt_dir, tag="preempt")
    run(engine, data, client["next_micro"], cfg)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        t = p.detach().float().contiguous()
        h.update(t.numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
