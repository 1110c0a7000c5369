"""FSDP2 (fully_shard) classifier trainer: frozen pretrained embedding, activation checkpointing,
bf16 autocast, warm-up + cosine schedule, epochs of 10 micro-batches at K = 4 (short last window)."""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class TrainConfig:
    vocab: int = 64
    dim: int = 32
    n_classes: int = 5
    seq: int = 12
    samples_per_rank: int = 40
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 2e-3
    warmup_steps: int = 2
    port: int = 49206


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Classifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList([Block(c.dim) for _ in range(2)])
        self.head = nn.Linear(c.dim, c.n_classes)
        self.use_ckpt = True

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=False) if self.use_ckpt else b(h)
        return self.head(h.mean(1))


def warmup_cosine(opt, warmup, total):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        prog = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * prog))
    return torch.optim.lr_scheduler.LambdaLR(opt, fn)


class FSDPTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(0)
        model = Classifier(cfg)
        model.embed.weight.requires_grad_(False)  # "pretrained", kept frozen
        for b in model.blocks:
            fully_shard(b)
        self.model = fully_shard(model)
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr)
        self.loader = self._loader()
        total_steps = math.ceil(len(self.loader) / cfg.grad_accum) * cfg.epochs
        self.sched = warmup_cosine(self.opt, cfg.warmup_steps, total_steps)

    def _loader(self):
        g = torch.Generator().manual_seed(100 + self.rank)
        ids = torch.randint(0, self.cfg.vocab, (self.cfg.samples_per_rank, self.cfg.seq), generator=g)
        labels = (ids[:, :3].sum(1) % self.cfg.n_classes)
        return DataLoader(TensorDataset(ids, labels), batch_size=self.cfg.micro_batch, shuffle=False)

    def _windows(self):
        K = self.cfg.grad_accum
        window = []
        for batch in self.loader:
            window.append(batch)
            if len(window) == K:
                yield window
                window = []
        if window:
            yield window

    def _train_window(self, window):
        n = len(window)
        for i, (ids, labels) in enumerate(window):
            self.model.set_requires_gradient_sync(i == n - 1)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = self.model(ids)
            loss = F.cross_entropy(logits.float(), labels) / n
            loss.backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for _ in range(self.cfg.epochs):
            for window in self._windows():
                self._train_window(window)


def full_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tr = FSDPTrainer(cfg, rank, world)
    tr.fit()
    digest = full_sha(tr.model)
    if rank == 0:
        print("FINAL_SHA256", digest, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2, TrainConfig()), nprocs=2, join=True)
