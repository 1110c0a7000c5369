"""Tiny causal LM trained with FSDP2 (fully_shard on each block, then the root).

Sequences have ragged lengths (right padding, label -100), so the loss is a token-level
sum normalised by a global token count (FSDP2 averages gradients over ranks, hence * W).
Accumulation: the reduce-scatter is deferred with set_requires_gradient_sync until the
last micro-batch of each window.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

VOCAB, PAD, IGNORE = 64, 0, -100


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--updates", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.ln(h))))


class TinyLM(nn.Module):
    def __init__(self, d=32, n_layer=2, seq_len=24):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.size(1)]
        for b in self.blocks:
            h = b(h)
        return self.lm_head(self.ln_f(h))


def build_corpus(n_seq, seq_len, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((n_seq, seq_len + 1), PAD, dtype=torch.long)
    for i in range(n_seq):
        L = int(torch.randint(4, seq_len + 2, (1,), generator=g))
        start = int(torch.randint(1, VOCAB, (1,), generator=g))
        step = int(torch.randint(1, 5, (1,), generator=g))
        ids[i, :L] = (start + step * torch.arange(L)) % (VOCAB - 1) + 1
    x = ids[:, :-1].clone()
    y = ids[:, 1:].clone()
    y[y == PAD] = IGNORE
    return x, y


def windows(x, y, mb, K):
    per = mb * K
    for s in range(0, len(x) - per + 1, per):
        yield [(x[s + j * mb: s + (j + 1) * mb], y[s + j * mb: s + (j + 1) * mb]) for j in range(K)]


def global_count(t):
    t = t.clone()
    dist.all_reduce(t)
    return t


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = TinyLM(seq_len=args.seq_len)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    K = args.accum
    n = args.micro_batch * K * W * args.updates
    x, y = build_corpus(n, args.seq_len, args.seed + 100)
    x, y = x[rank::W], y[rank::W]

    for window in windows(x, y, args.micro_batch, K):
        n_tok = global_count(sum((yb != IGNORE).sum() for _, yb in window))
        for j, (xb, yb) in enumerate(window):
            model.set_requires_gradient_sync(j == K - 1)
            logits = model(xb)
            loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), yb.reshape(-1),
                                       ignore_index=IGNORE, reduction="sum")
            loss = loss_sum / n_tok * W
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    full = {name: p.full_tensor().detach() for name, p in model.named_parameters()}
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for t in full.values():
            h.update(t.float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
