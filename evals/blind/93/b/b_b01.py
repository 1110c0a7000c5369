"""Regression head on a small MLP trunk, trained with a DeepSpeed engine (ZeRO-0, fp32).

The engine owns accumulation (config GA); the trainer keeps a handle on the client
optimizer so it can read / log the learning rate of each group.
"""
import hashlib
import os
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class RunConfig:
    micro_batch: int = 4
    grad_accum: int = 4
    updates: int = 12
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234
    ds: dict = field(default_factory=dict)

    def deepspeed_config(self, world):
        cfg = {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "train_batch_size": self.micro_batch * self.grad_accum * world,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 0},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
            "wall_clock_breakdown": False,
        }
        cfg.update(self.ds)
        return cfg


class Net(nn.Module):
    def __init__(self, d_in=16, d_h=32):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, d_h), nn.GELU(), nn.Linear(d_h, d_h), nn.GELU())
        self.head = nn.Linear(d_h, 1)

    def forward(self, x):
        return self.head(self.trunk(x)).squeeze(-1)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, generator=g)
    return x, y


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = Net()
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=self.optimizer, config=cfg.deepspeed_config(self.world))
        n = cfg.micro_batch * cfg.grad_accum * self.world * cfg.updates
        x, y = make_data(n, cfg.seed + 1)
        # rank-strided shard
        self.x, self.y = x[self.rank::self.world], y[self.rank::self.world]
        self.loss_fn = nn.MSELoss()

    def micro_batches(self):
        mb = self.cfg.micro_batch
        for i in range(0, len(self.x), mb):
            yield self.x[i:i + mb], self.y[i:i + mb]

    def train(self):
        self.engine.train()
        K = self.cfg.grad_accum
        for i, (xb, yb) in enumerate(self.micro_batches()):
            loss = self.loss_fn(self.engine(xb), yb)
            self.engine.backward(loss)
            if (i + 1) % K == 0:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

    def digest(self):
        if os.environ.get("PARAM_DUMP") and self.rank == 0:
            torch.save({n: p.detach().clone() for n, p in self.engine.module.named_parameters()},
                       os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = Trainer(RunConfig())
    trainer.train()
    d = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
