"""FSDP2 (fully_shard) training of a tiny pre-norm transformer encoder on spawned ranks.

Norm weights and biases (1-D parameters) are kept replicated instead of sharded:
sharding tensors of a few dozen elements only costs extra collectives.
Gradient accumulation uses set_requires_gradient_sync on the last micro-batch.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, default=49122)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seq", type=int, default=12)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyEncoder(nn.Module):
    def __init__(self, vocab, dim, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(2)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def shard_model(model):
    replicated = {p for p in model.parameters() if p.ndim < 2}
    for block in model.blocks:
        fully_shard(block, ignored_params=replicated)
    fully_shard(model, ignored_params=replicated)
    return replicated


def batches(args, rank):
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    while True:
        idx = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), generator=g)
        yield idx[:, :-1], idx[:, 1:]


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    model = TinyEncoder(args.vocab, args.dim, args.seq)
    replicated = shard_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    data = batches(args, rank)

    for step in range(args.steps):
        for micro in range(args.grad_accum):
            model.set_requires_gradient_sync(micro == args.grad_accum - 1)
            x, y = next(data)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
            (loss / args.grad_accum).backward()
        for p in [q for q in model.parameters() if q in replicated]:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sha = param_sha(model)
    if rank == 0:
        print("FINAL_SHA256", sha, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)
