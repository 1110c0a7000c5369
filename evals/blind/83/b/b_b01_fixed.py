"""FSDP2 (fully_shard) pretraining of a small MLP-mixer style LM on synthetic tokens.

bf16 compute to halve activation memory; gradient sync is skipped on the
accumulation micro-steps so that only the last micro-step of a window
reduce-scatters.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


@dataclass
class TrainConfig:
    vocab: int = 96
    dim: int = 64
    seq: int = 24
    n_blocks: int = 2
    micro_bs: int = 4
    grad_accum: int = 8
    steps: int = 10
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Parameter(torch.randn(cfg.seq, cfg.dim) * 0.02)
        self.blocks = nn.ModuleList([Block(cfg.dim) for _ in range(cfg.n_blocks)])
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_data(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 7)
    n = cfg.steps * cfg.grad_accum * cfg.micro_bs * world
    data = torch.randint(0, cfg.vocab, (n, cfg.seq + 1), generator=g)
    # a learnable pattern: every third token repeats the one before
    data[:, 2::3] = data[:, 1:-1:3]
    data = data[rank::world]
    return data.view(cfg.steps, cfg.grad_accum, cfg.micro_bs, cfg.seq + 1)


def shard_model(model):
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = shard_model(TinyLM(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    data = make_data(cfg, rank, world)

    for step in range(cfg.steps):
        for micro in range(cfg.grad_accum):
            last = micro == cfg.grad_accum - 1
            model.set_requires_gradient_sync(last)
            batch = data[step, micro]
            loss = model(batch[:, :-1], batch[:, 1:]) / cfg.grad_accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item() * cfg.grad_accum:.4f}", flush=True)

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        full = p.full_tensor().detach().float().contiguous()
        h.update(full.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
