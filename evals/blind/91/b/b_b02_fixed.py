"""FSDP2 (fully_shard) pre-training of a tiny residual MLP language model.

bf16 compute through MixedPrecisionPolicy, nested units (one per block + root), gradient
accumulation with set_requires_gradient_sync, global-norm clip on the DTensor grads.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--param-dtype", default="bf16", choices=DTYPES)
    p.add_argument("--reduce-dtype", default="fp32", choices=DTYPES)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        h = self.emb(idx)
        for b in self.blocks:
            h = b(h)
        return self.out(self.norm(h))


def shard(model, args):
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[args.param_dtype],
                              reduce_dtype=DTYPES[args.reduce_dtype])
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def batches(rank, args):
    g = torch.Generator().manual_seed(7 + rank)
    total = args.steps * args.accum
    data = torch.randint(0, args.vocab, (total, args.micro_bs, args.seq + 1), generator=g)
    # a learnable pattern: next token = (token * 3 + 1) % vocab half of the time
    nxt = (data[..., :-1] * 3 + 1) % args.vocab
    keep = torch.rand(nxt.shape, generator=g) < 0.5
    data[..., 1:] = torch.where(keep, nxt, data[..., 1:])
    for i in range(total):
        yield data[i, :, :-1], data[i, :, 1:]


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = shard(TinyLM(args.vocab, args.dim, args.layers), args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    K = args.accum
    for i, (x, y) in enumerate(batches(rank, args)):
        last = (i + 1) % K == 0
        model.set_requires_gradient_sync(last)
        logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1)) / K
        loss.backward()
        if last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    sha = digest(model)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
