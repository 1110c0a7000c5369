"""ZeRO-2 pretraining of a small MLP mixer with a batch-size ramp.

Phase 1 uses a global batch of 8 (GA 2); after `ramp_after` optimizer steps the
global batch is doubled through DeepSpeed's `set_train_batch_size` (GA 4), the
usual "batch-size warm-up" trick. Every micro-step is fed to engine.backward /
engine.step, DeepSpeed decides the boundaries.
"""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class RampConfig:
    micro_batch: int = 2
    start_global_batch: int = 8     # GA 2 on 2 ranks
    final_global_batch: int = 16    # GA 4 on 2 ranks
    ramp_after: int = 3             # optimizer steps at the small batch
    total_steps: int = 9
    lr: float = 3e-3
    warmup: int = 4
    seed: int = 1234
    d_in: int = 24
    hidden: int = 48


class Mixer(nn.Module):
    def __init__(self, d_in, hidden):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU()) for _ in range(2)]
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h).squeeze(-1)


def make_stream(cfg, rank, n):
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    w = torch.randn(cfg.d_in, generator=torch.Generator().manual_seed(99))
    for _ in range(n):
        x = torch.randn(cfg.micro_batch, cfg.d_in, generator=g)
        y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg.micro_batch, generator=g)
        yield x, y


def ds_config(cfg):
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "train_batch_size": cfg.start_global_batch,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,
                              "reduce_bucket_size": 200000, "allgather_bucket_size": 200000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }


class RampTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        model = Mixer(cfg.d_in, cfg.hidden)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=ds_config(cfg)
        )

    def maybe_ramp(self, step):
        if step == self.cfg.ramp_after:
            self.engine.set_train_batch_size(self.cfg.final_global_batch)

    def micro_step(self, x, y):
        pred = self.engine(x)
        loss = nn.functional.mse_loss(pred, y)
        self.engine.backward(loss)
        self.engine.step()
        return loss.item()

    def fit(self):
        rank = dist.get_rank()
        stream = make_stream(self.cfg, rank, 10 ** 6)
        for step in range(self.cfg.total_steps):
            self.maybe_ramp(step)
            ga = self.engine.gradient_accumulation_steps()
            for k in range(ga):
                x, y = next(stream)
                self.micro_step(x, y)


def final_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    trainer = RampTrainer(RampConfig())
    trainer.fit()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", final_sha(trainer.engine.module), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
