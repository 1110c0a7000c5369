"""FSDP2 on spawned ranks: nested fully_shard units with bf16 compute and fp32
gradient reduction, a frozen positional table, padded sequences of uneven
length, a token-level loss normalised over the whole window on all ranks,
epochs that end in a short window, and a global-norm clip on DTensors.
"""
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class Cfg:
    world: int = 2
    port: int = 49151
    vocab: int = 40
    dim: int = 32
    max_len: int = 14
    micro_bs: int = 3
    batches_per_epoch: int = 10   # per rank; with accum 4 -> windows of 4, 4, 2
    accum: int = 4
    epochs: int = 2
    lr: float = 3e-3
    clip: float = 0.5
    seed: int = 5


class MixBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.shift = nn.Linear(dim, dim, bias=False)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm(x)
        prev = F.pad(h, (0, 0, 1, 0))[:, :-1]
        return x + self.ff(h + self.shift(prev))


class TokenLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Parameter(torch.randn(c.max_len, c.dim) * 0.1, requires_grad=False)
        self.blocks = nn.ModuleList([MixBlock(c.dim) for _ in range(3)])
        self.norm = nn.LayerNorm(c.dim)
        self.lm_head = nn.Linear(c.dim, c.vocab)

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.norm(x))


def epoch_batches(c, rank, epoch):
    g = torch.Generator().manual_seed(c.seed * 997 + rank * 31 + epoch)
    out = []
    for _ in range(c.batches_per_epoch):
        lens = torch.randint(3, c.max_len + 1, (c.micro_bs,), generator=g)
        ids = torch.randint(1, c.vocab, (c.micro_bs, c.max_len), generator=g)
        labels = torch.roll(ids, -1, dims=1)
        for i, n in enumerate(lens.tolist()):
            ids[i, n:] = 0
            labels[i, n - 1:] = -100
        out.append((ids, labels))
    return out


def windows(batches, k):
    return [batches[i:i + k] for i in range(0, len(batches), k)]


def shard(model):
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(rank, c):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(c.port))
    dist.init_process_group("gloo", rank=rank, world_size=c.world)
    torch.manual_seed(c.seed)
    torch.use_deterministic_algorithms(True)

    model = TokenLM(c)
    shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.lr)

    for epoch in range(c.epochs):
        for win in windows(epoch_batches(c, rank, epoch), c.accum):
            n_tok = torch.tensor(float(sum((lab != -100).sum().item() for _, lab in win)))
            dist.all_reduce(n_tok)  # valid tokens in this window, all ranks
            for j, (ids, labels) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(ids).float()
                loss_sum = F.cross_entropy(logits.reshape(-1, c.vocab), labels.reshape(-1),
                                           ignore_index=-100, reduction="sum")
                (loss_sum * c.world / n_tok).backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], c.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    sha = sha_of(model)
    if rank == 0:
        print("FINAL_SHA256", sha, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = Cfg()
    mp.spawn(train, args=(cfg,), nprocs=cfg.world, join=True)
