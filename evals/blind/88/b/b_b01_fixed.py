"""FSDP2 (fully_shard) on spawned ranks: token-level LM objective on a tiny
transformer, gradient accumulation with the reduce-scatter deferred to the last
micro-batch of each window."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    vocab: int = 64
    d: int = 32
    n_layer: int = 2
    seq: int = 16
    micro_bs: int = 4
    accum: int = 4
    steps: int = 8
    lr: float = 3e-3
    port: int = 40111
    world: int = 2


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        h = self.ln(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d)
        self.pos = nn.Parameter(torch.zeros(c.seq, c.d))
        self.blocks = nn.ModuleList([Block(c.d) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.d)
        self.head = nn.Linear(c.d, c.vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.size(1)]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def make_data(c: Cfg, rank):
    g = torch.Generator().manual_seed(1000 + rank)
    n = c.steps * c.accum * c.micro_bs
    x = torch.randint(0, c.vocab, (n, c.seq + 1), generator=g)
    return x.split(c.micro_bs)


def set_sync(model, on: bool, last: bool):
    # defer the reduce-scatter to the window's last backward
    model.set_requires_gradient_sync(last)


def worker(rank, c: Cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(c.port)
    dist.init_process_group("gloo", rank=rank, world_size=c.world)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = TinyLM(c)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.01)

    batches = make_data(c, rank)
    model.train()
    for step in range(c.steps):
        window = batches[step * c.accum:(step + 1) * c.accum]
        for k, mb in enumerate(window):
            last = k == c.accum - 1
            set_sync(model, True, last)
            logits = model(mb[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, c.vocab), mb[:, 1:].reshape(-1))
            (loss / c.accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    fulls = [(n, p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in model.named_parameters()]
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = Cfg()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world, join=True)
