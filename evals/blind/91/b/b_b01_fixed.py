"""ZeRO-2 fine-tuning of a small MLP regressor with a config built from a dataclass.

Launched with the deepspeed launcher; the engine owns gradient accumulation, the loop
calls engine.backward / engine.step on every micro-batch as DeepSpeed expects.
"""
import hashlib
import os
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class TrainConfig:
    micro_batch: int = 8
    grad_accum: int = 4
    lr: float = 0.05
    momentum: float = 0.9
    max_grad_norm: float = 0.0
    zero_stage: int = 2
    steps: int = 12
    seed: int = 1234

    def to_ds_config(self) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_clipping": self.max_grad_norm,
            "zero_optimization": {
                "stage": self.zero_stage,
                "contiguous_gradients": True,
                "overlap_comm": False,
                "reduce_bucket_size": 50_000,
            },
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
            "wall_clock_breakdown": False,
        }


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(),
                                  nn.Linear(d_hidden, d_hidden), nn.Tanh())
        self.head = nn.Linear(d_hidden, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make_data(rank, n, d_in=16):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, d_in, generator=g)
    w = torch.linspace(-1, 1, d_in)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, generator=g)
    return x, y


def final_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(cfg.seed)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=cfg.to_ds_config())

    n_micro = cfg.steps * cfg.grad_accum
    x, y = make_data(rank, n_micro * cfg.micro_batch)
    loss_fn = nn.MSELoss()
    for i in range(n_micro):
        sl = slice(i * cfg.micro_batch, (i + 1) * cfg.micro_batch)
        loss = loss_fn(engine(x[sl]), y[sl])
        engine.backward(loss)
        engine.step()

    sha = final_sha(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
