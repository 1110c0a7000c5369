"""Config-driven DeepSpeed ZeRO-2 trainer for a tiny token classifier.

The engine owns accumulation (gradient_accumulation_steps in the config); the
trainer calls engine.backward / engine.step on every micro-batch and hands a
client warm-up + linear-decay schedule to deepspeed.initialize, which steps it
at each accumulation boundary.
"""
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler


@dataclass
class RunConfig:
    seed: int = 1234
    vocab: int = 96
    dim: int = 48
    seq_len: int = 16
    n_samples: int = 96
    micro_batch: int = 4
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    warmup_frac: float = 0.1
    weight_decay: float = 0.01
    clip: float = 0.0
    stage: int = 2

    def ds_config(self, world: int) -> dict:
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "train_batch_size": self.micro_batch * self.grad_accum * world,
            "gradient_clipping": self.clip,
            "zero_optimization": {"stage": self.stage, "overlap_comm": False,
                                  "contiguous_gradients": True},
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }


class SyntheticTokens(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed + 7)
        self.x = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
        self.y = (self.x * 7 + 3) % 5

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Tagger(nn.Module):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.mix = nn.Sequential(nn.Linear(cfg.dim, 2 * cfg.dim), nn.GELU(),
                                 nn.Linear(2 * cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, 5)

    def forward(self, x):
        h = self.emb(x)
        h = self.norm(h + self.mix(h))
        return self.head(h)


def warmup_linear(total_steps: int, warmup_steps: int):
    def fn(step):
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return fn


class DSTrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        model = Tagger(cfg)
        self.dataset = SyntheticTokens(cfg)
        self.sampler = DistributedSampler(self.dataset, num_replicas=self.world,
                                          rank=self.rank, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(self.dataset, batch_size=cfg.micro_batch,
                                 sampler=self.sampler, drop_last=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr,
                                      weight_decay=cfg.weight_decay)
        total_updates = self.planned_updates()
        sched = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_linear(total_updates, max(1, int(cfg.warmup_frac * total_updates))))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=sched,
            config=cfg.ds_config(self.world))

    def planned_updates(self) -> int:
        # one scheduler step per batch of the loader
        return self.cfg.epochs * len(self.loader)

    def train(self):
        self.engine.train()
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                logits = self.engine(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                self.engine.backward(loss)
                self.engine.step()
        if self.rank == 0:
            print(f"updates={self.engine.global_steps} lr_end={self.scheduler.get_last_lr()[0]:.6f}")

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    cfg = RunConfig()
    trainer = DSTrainer(cfg)
    trainer.train()
    sha = trainer.final_sha()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {sha}")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
