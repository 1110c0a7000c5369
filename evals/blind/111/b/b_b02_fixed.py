"""Tiny causal LM pre-training with FSDP2 (fully_shard) written by hand.

bf16 compute through FSDP2's MixedPrecisionPolicy, gradient sync deferred to
the last micro-step of each accumulation window, AdamW on the fp32 shards.
Run with torchrun on 2 ranks.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

p = argparse.ArgumentParser()
p.add_argument("--vocab", type=int, default=128)
p.add_argument("--d_model", type=int, default=64)
p.add_argument("--n_layer", type=int, default=2)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--block", type=int, default=16)
p.add_argument("--micro_bs", type=int, default=4)
p.add_argument("--grad_accum", type=int, default=4)
p.add_argument("--max_iters", type=int, default=10)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--seed", type=int, default=7)
args = p.parse_args()


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.d_model)
        self.wpe = nn.Embedding(args.block, args.d_model)
        self.blocks = nn.ModuleList([Block(args.d_model, args.n_head) for _ in range(args.n_layer)])
        self.ln_f = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, args.vocab, bias=False)

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), diagonal=1)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def get_batch(step, micro, rank):
    g = torch.Generator().manual_seed(args.seed * 100003 + step * 1009 + micro * 31 + rank)
    start = torch.randint(0, args.vocab, (args.micro_bs, 1), generator=g)
    stride = torch.randint(1, 5, (args.micro_bs, 1), generator=g)
    seq = (start + stride * torch.arange(args.block + 1)) % args.vocab
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, args.vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    model = TinyLM()

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    for it in range(args.max_iters):
        for micro in range(args.grad_accum):
            model.set_requires_gradient_sync(micro == args.grad_accum - 1)
            x, y = get_batch(it, micro, rank)
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
            (loss / args.grad_accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, prm in model.named_parameters():
        full = prm.full_tensor()
        if rank == 0:
            h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
