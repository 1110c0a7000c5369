"""Review-score regression with a small bag-of-words encoder on DDP.

Trainer class with a config dataclass, DistributedSampler, gradient
accumulation with no_sync, and a warm-up + cosine schedule from transformers.
Two ranks via torchrun on CPU (gloo), synthetic data.
"""
import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import get_cosine_schedule_with_warmup


@dataclass
class Config:
    n_samples: int = 192
    vocab: int = 500
    seq_len: int = 16
    dim: int = 32
    micro_batch_size: int = 4
    grad_accum_steps: int = 4
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    warmup_ratio: float = 0.1
    seed: int = 2024


class ScoreModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.EmbeddingBag(cfg.vocab, cfg.dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.ReLU(), nn.Linear(cfg.dim, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids)).squeeze(-1)


def build_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    polarity = torch.linspace(-1, 1, cfg.vocab)
    score = polarity[ids].mean(1) * 3 + 0.1 * torch.randn(cfg.n_samples, generator=g)
    return TensorDataset(ids, score)


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = DDP(ScoreModel(cfg))
        self.dataset = build_dataset(cfg)
        self.sampler = DistributedSampler(self.dataset, shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(self.dataset, batch_size=cfg.micro_batch_size, sampler=self.sampler)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        # optimizer updates = samples seen / global batch (micro x accum x ranks)
        total_updates = cfg.epochs * len(self.loader) // (cfg.grad_accum_steps * self.world_size)
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer,
            num_warmup_steps=max(1, math.ceil(cfg.warmup_ratio * total_updates)),
            num_training_steps=total_updates,
        )
        self.global_step = 0

    def training_step(self, ids, target, sync):
        ctx = nullcontext() if sync else self.model.no_sync()
        with ctx:
            pred = self.model(ids)
            loss = F.mse_loss(pred, target) / self.cfg.grad_accum_steps
            loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1

    def fit(self):
        K = self.cfg.grad_accum_steps
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            running = 0.0
            for i, (ids, target) in enumerate(self.loader):
                sync = (i + 1) % K == 0
                running += self.training_step(ids, target, sync).item()
                if sync:
                    self.optimizer_step()
                    if self.rank == 0 and self.global_step % 3 == 0:
                        print(f"epoch {epoch} step {self.global_step} loss {running:.4f} "
                              f"lr {self.scheduler.get_last_lr()[0]:.5f}")
                    running = 0.0

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    trainer = Trainer(Config())
    trainer.fit()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {trainer.digest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
