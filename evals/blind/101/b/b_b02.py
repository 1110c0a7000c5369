"""Tiny causal LM with FSDP2 (fully_shard) on a 2-D device mesh.

The mesh is laid out (replicate, shard) so the same script scales to
multi-node HSDP; on this box it is 2 x 1. Gradient accumulation uses
set_requires_gradient_sync so the reduction runs once per window.
"""
import argparse
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--d-model", type=int, default=48)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


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
    def __init__(self, vocab, d, n_layer, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos[:T]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def batches(args, rank, n):
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    for _ in range(n):
        base = torch.randint(0, args.vocab, (args.micro_bs, 1), generator=g)
        step = torch.randint(1, 5, (args.micro_bs, 1), generator=g)
        seq = (base + step * torch.arange(args.seq_len + 1)) % args.vocab
        yield seq[:, :-1], seq[:, 1:]


def shard_model(model, mesh):
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    model = TinyLM(args.vocab, args.d_model, args.n_layer, args.seq_len)
    model = shard_model(model, mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    K = args.grad_accum
    data = batches(args, rank, args.steps * K)
    for step in range(args.steps):
        for k in range(K):
            x, y = next(data)
            model.set_requires_gradient_sync(k == K - 1)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1)) / K
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {loss.item() * K:.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
