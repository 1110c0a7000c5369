"""Tiny causal LM trained with a DeepSpeed ZeRO-2 engine wrapped in a small trainer class.

The engine owns accumulation (gradient_accumulation_steps in the config) and the
warm-up/decay schedule (WarmupDecayLR in the config).
"""
import argparse
import hashlib
import os
from dataclasses import dataclass, asdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import deepspeed


@dataclass
class TrainerConfig:
    vocab_size: int = 64
    d_model: int = 32
    seq_len: int = 16
    micro_batch_size: int = 4
    grad_accum_steps: int = 3
    num_epochs: int = 2
    num_samples: int = 96
    peak_lr: float = 3e-3
    warmup_steps: int = 2
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 1234


class TinyLM(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mix = nn.GRU(d_model, d_model, batch_first=True)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx, targets):
        h, _ = self.mix(self.embed(idx))
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    data = torch.randint(0, cfg.vocab_size, (cfg.num_samples, cfg.seq_len + 1), generator=g)
    return TensorDataset(data[:, :-1].contiguous(), data[:, 1:].contiguous())


class DeepSpeedTrainer:
    def __init__(self, cfg: TrainerConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.sampler = DistributedSampler(make_dataset(cfg), num_replicas=self.world,
                                          rank=self.rank, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(self.sampler.dataset, batch_size=cfg.micro_batch_size,
                                 sampler=self.sampler, drop_last=True)
        model = TinyLM(cfg.vocab_size, cfg.d_model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.peak_lr,
                                      weight_decay=cfg.weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                    config=self.ds_config())

    def total_training_steps(self):
        return self.cfg.num_epochs * len(self.loader)

    def ds_config(self):
        c = self.cfg
        return {
            "train_micro_batch_size_per_gpu": c.micro_batch_size,
            "gradient_accumulation_steps": c.grad_accum_steps,
            "gradient_clipping": c.clip,
            "zero_optimization": {"stage": 2},
            "scheduler": {
                "type": "WarmupDecayLR",
                "params": {
                    "warmup_min_lr": 0.0,
                    "warmup_max_lr": c.peak_lr,
                    "warmup_num_steps": c.warmup_steps,
                    "total_num_steps": self.total_training_steps(),
                    "warmup_type": "linear",
                },
            },
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.engine.train()
        for inputs, targets in self.loader:
            loss = self.engine(inputs, targets)
            self.engine.backward(loss)
            self.engine.step()
        return loss.item()

    def fit(self):
        for epoch in range(self.cfg.num_epochs):
            last = self.train_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch} loss {last:.4f} opt_steps {self.engine.global_steps} "
                      f"lr {self.engine.get_lr()[0]:.6f}", flush=True)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args, _ = parser.parse_known_args()
    cfg = TrainerConfig()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = DeepSpeedTrainer(cfg)
    trainer.fit()
    digest = trainer.final_digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
