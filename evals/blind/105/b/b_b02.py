"""Tiny causal LM trained with FSDP2 (fully_shard) on 2 CPU ranks.
Gradient accumulation defers the reduce-scatter to the last micro-batch of each window."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    vocab: int = 96
    d_model: int = 48
    n_layers: int = 3
    seq_len: int = 24
    micro_batch: int = 4
    grad_accum: int = 4
    max_steps: int = 16
    lr: float = 2e-3
    seed: int = 7


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList([Block(cfg.d_model) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos[:T]
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln_f(x))


def shard_model(model: TinyLM):
    for blk in model.blocks:
        fully_shard(blk)
    return model


def fsdp_units(model):
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def set_sync(units, flag):
    for u in units:
        u.set_requires_gradient_sync(flag, recurse=False)


def batches(cfg, rank):
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    n = cfg.max_steps * cfg.grad_accum
    base = torch.randint(0, cfg.vocab, (n, cfg.micro_batch, 1), generator=g)
    step = torch.randint(1, 4, (n, cfg.micro_batch, 1), generator=g)
    seq = (base + step * torch.arange(cfg.seq_len + 1)) % cfg.vocab  # learnable arithmetic sequences
    for i in range(n):
        yield seq[i, :, :-1], seq[i, :, 1:]


def main():
    cfg = Cfg()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(cfg.seed)
    model = shard_model(TinyLM(cfg))
    units = fsdp_units(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, foreach=False)

    for i, (x, y) in enumerate(batches(cfg, rank)):
        last = (i + 1) % cfg.grad_accum == 0
        set_sync(units, last)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1)) / cfg.grad_accum
        loss.backward()
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
