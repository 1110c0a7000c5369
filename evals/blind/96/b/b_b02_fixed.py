"""Tiny causal LM on FSDP2 (fully_shard per block + root), token-level loss.

Each window of `grad_accum` micro-batches is normalised by the number of target
tokens in the whole window on all ranks; FSDP2 averages the reduce-scatter over
ranks, so the per-rank loss carries a factor of world_size.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard, FSDPModule

VOCAB, D, SEQ = 64, 32, 12
IGNORE = -100


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.zeros(SEQ, D))
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.size(1)]
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def make_micro_batch(g, rank):
    # prompts are masked; rank 1 sees longer prompts, so fewer target tokens
    bsz = 3
    idx = torch.randint(0, VOCAB, (bsz, SEQ), generator=g)
    labels = idx.clone()
    for r in range(bsz):
        p = int(torch.randint(2, 6, (1,), generator=g)) + 4 * rank
        labels[r, : min(p, SEQ - 1)] = IGNORE
    return idx, labels


def window_target_count(window):
    """Target tokens in this window, summed over all ranks."""
    n = torch.tensor(sum(int((lab != IGNORE).sum()) for _, lab in window)).float()
    dist.all_reduce(n)
    return n.item()


def lm_loss_sum(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def full_params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=3)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM()
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    g = torch.Generator().manual_seed(100 + rank)
    K = args.grad_accum
    for step in range(args.updates):
        window = [make_micro_batch(g, rank) for _ in range(K)]
        n_tgt = window_target_count(window)
        for k, (idx, labels) in enumerate(window):
            model.set_requires_gradient_sync(k == K - 1)
            loss = lm_loss_sum(model(idx), labels) * world / n_tgt
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} loss/tok {loss.item() / world:.4f}", flush=True)

    sha = full_params_sha(model)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
