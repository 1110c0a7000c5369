# ZeRO-2 regression fine-tune driven by a hand loop around the DeepSpeed engine.
# The DeepSpeed config lives in a JSON file next to the run (written here so the
# example is self-contained); the engine owns accumulation (GA in the config).
import hashlib
import json
import os

import numpy as np
import torch
import torch.nn as nn
import deepspeed

MICRO_BS = 4
GRAD_ACC = 4
STEPS = 10
LR = 5e-2
HERE = os.path.dirname(os.path.abspath(__file__))


def write_ds_config(path, world):
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_accumulation_steps": GRAD_ACC,
        "train_batch_size": MICRO_BS * GRAD_ACC * world,
        "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}},
        # no clipping for this run: the loss is already bounded
        "gradient_clip": 0.0,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        return self.out(self.body(x))


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(0)
    model = Regressor()

    cfg_path = os.path.join(HERE, f"b_b01_ds_config.rank{rank}.json")
    write_ds_config(cfg_path, world)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg_path)
    os.remove(cfg_path)

    g = torch.Generator().manual_seed(1234)
    n_total = STEPS * GRAD_ACC * MICRO_BS * world
    X = torch.randn(n_total, 16, generator=g) * 3.0
    Y = torch.randn(n_total, 4, generator=g) * 5.0 + 3.0
    shard = torch.arange(rank, n_total, world)
    X, Y = X[shard], Y[shard]

    engine.train()
    for i in range(STEPS * GRAD_ACC):
        xb = X[i * MICRO_BS:(i + 1) * MICRO_BS]
        yb = Y[i * MICRO_BS:(i + 1) * MICRO_BS]
        loss = nn.functional.mse_loss(engine(xb), yb)
        engine.backward(loss)
        engine.step()

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())


if __name__ == "__main__":
    main()
