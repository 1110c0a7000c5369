"""Regression-head pre-training on DeepSpeed ZeRO-2.

The training loop owns gradient accumulation: it runs `accum_steps` micro-batches
through `engine.backward` and calls `engine.step()` once per window.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import deepspeed


@dataclass
class RunConfig:
    micro_batch: int = 4
    accum_steps: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.01
    clip: float = 0.0
    windows: int = 12
    seed: int = 1234


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hid=32):
        super().__init__()
        self.embed = nn.Linear(d_in, d_hid)
        self.blocks = nn.Sequential(nn.GELU(), nn.Linear(d_hid, d_hid), nn.GELU(), nn.Linear(d_hid, d_hid))
        self.head = nn.Linear(d_hid, 1)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x))).squeeze(-1)


def make_ds_config(cfg: RunConfig, world: int) -> dict:
    return {
        # the engine accumulates over the window and steps on its boundary
        "train_batch_size": cfg.micro_batch * world * cfg.accum_steps,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_clipping": cfg.clip,
        "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False},
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
                                                   "torch_adam": True}},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def batches(rank, cfg: RunConfig):
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    w_true = torch.randn(16, generator=torch.Generator().manual_seed(cfg.seed))
    for _ in range(cfg.windows * cfg.accum_steps):
        x = torch.randn(cfg.micro_batch, 16, generator=g)
        y = torch.tanh(x @ w_true) + 0.1 * torch.randn(cfg.micro_batch, generator=g)
        yield x, y


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--accum-steps", type=int, default=RunConfig.accum_steps)
    args = ap.parse_args()
    cfg = RunConfig(accum_steps=args.accum_steps)

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(cfg.seed)
    model = Regressor()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=make_ds_config(cfg, world))
    loss_fn = nn.MSELoss()

    for i, (x, y) in enumerate(batches(rank, cfg)):
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        if (i + 1) % cfg.accum_steps == 0:
            if rank == 0 and ((i + 1) // cfg.accum_steps) % 4 == 0:
                print(f"update {(i + 1) // cfg.accum_steps} loss {loss.item():.4f}", flush=True)

    sha = params_sha(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
