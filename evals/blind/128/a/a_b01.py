"""Token tagger trained with a small DDP trainer class (CPU / gloo, 2 ranks).

Gradient accumulation: K micro-batches per optimizer step, DDP sync only on the
last micro-batch of each window (no_sync on the others).
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import chain

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    vocab: int = 96
    n_tags: int = 7
    d_model: int = 48
    seq_len: int = 16
    micro_batch: int = 4
    grad_accum: int = 4
    windows: int = 12
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234


def sinusoid(seq_len, d):
    pos = torch.arange(seq_len).float()[:, None]
    i = torch.arange(0, d, 2).float()[None, :]
    ang = pos / (10000 ** (i / d))
    out = torch.zeros(seq_len, d)
    out[:, 0::2] = torch.sin(ang)
    out[:, 1::2] = torch.cos(ang)
    return out


class Positional(nn.Module):
    """Fixed sinusoidal table (buffer) with a learned per-channel gain."""

    def __init__(self, seq_len, d):
        super().__init__()
        self.register_buffer("table", sinusoid(seq_len, d), persistent=False)
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, n):
        return self.gain * self.table[:n]


class Tagger(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = Positional(cfg.seq_len, cfg.d_model)
        self.mix = nn.Sequential(nn.Linear(cfg.d_model, 2 * cfg.d_model), nn.GELU(),
                                 nn.Linear(2 * cfg.d_model, cfg.d_model))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.n_tags)

    def forward(self, ids):
        h = self.tok_emb(ids) + self.pos(ids.shape[1])
        h = h + self.mix(h)
        return self.head(self.norm(h))


def make_data(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 17)
    n = cfg.windows * cfg.grad_accum * cfg.micro_batch * world
    ids = torch.randint(0, cfg.vocab, (n, cfg.seq_len), generator=g)
    tags = (ids * 5 + torch.roll(ids, 1, dims=1)) % cfg.n_tags
    ids, tags = ids[rank::world], tags[rank::world]
    return list(zip(ids.split(cfg.micro_batch), tags.split(cfg.micro_batch)))


class DDPTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = Tagger(cfg)
        # the positional table is recomputed identically on every rank:
        # keep DDP from broadcasting / touching it
        skip = [n for n, _ in chain(model.named_parameters(), model.named_buffers())
                if n.startswith("pos.")]
        DDP._set_params_and_buffers_to_ignore_for_model(model, skip)
        self.model = DDP(model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                     weight_decay=cfg.weight_decay)
        self.batches = make_data(cfg, self.rank, self.world)

    def micro_step(self, batch, sync):
        ids, tags = batch
        ctx = nullcontext() if sync else self.model.no_sync()
        with ctx:
            logits = self.model(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tags.reshape(-1))
            (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def fit(self):
        K = self.cfg.grad_accum
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        for i, batch in enumerate(self.batches):
            last = (i + 1) % K == 0
            loss = self.micro_step(batch, sync=last)
            if last:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                if self.rank == 0 and ((i + 1) // K) % 4 == 0:
                    print(f"step {(i + 1) // K} loss {loss.item():.4f}", flush=True)

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    trainer = DDPTrainer(TrainConfig())
    trainer.fit()
    sha = trainer.final_sha()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
