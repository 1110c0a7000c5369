"""Offline policy-gradient fine-tuning of a tiny causal LM with a KL penalty to a reference.

Hand-written loop, DDP on 2 CPU ranks (gloo), gradient accumulation with no_sync.
Launch with torchrun.
"""
import argparse
import contextlib
import copy
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class TinyCausalLM(nn.Module):
    def __init__(self, vocab=64, d=32, ctx=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.mix = nn.Linear(2 * d, d)
        self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        # causal running mean as a cheap stand-in for attention
        ctx = h.cumsum(1) / torch.arange(1, T + 1, device=idx.device).view(1, T, 1)
        h = h + self.mix(torch.cat([h, ctx], -1))
        h = h + self.ff(h)
        return self.lm_head(h)


def build_reference(policy):
    """Frozen snapshot of the policy; the token embedding is shared to save memory."""
    ref = copy.deepcopy(policy)
    ref.wte = policy.wte
    for n, p in ref.named_parameters():
        if not n.startswith("wte."):
            p.requires_grad_(False)
    ref.eval()
    return ref


def token_logprobs(logits, idx):
    lp = F.log_softmax(logits[:, :-1].float(), -1)
    return lp.gather(-1, idx[:, 1:, None]).squeeze(-1), lp


def make_rollouts(n, T, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (n, T), generator=g)
    rewards = torch.randn(n, generator=g)
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    return seqs, adv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro_batch", type=int, default=4)
    ap.add_argument("--grad_accum", type=int, default=4)
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--kl_coef", type=float, default=0.1)
    ap.add_argument("--seq_len", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=64)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    policy = TinyCausalLM(args.vocab, 32, args.seq_len)
    ref = build_reference(policy)
    model = DDP(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)

    n_per_update = args.micro_batch * args.grad_accum * world
    seqs, adv = make_rollouts(n_per_update * args.updates, args.seq_len, args.vocab, seed=7)

    K = args.grad_accum
    for update in range(args.updates):
        base = update * n_per_update
        opt.zero_grad(set_to_none=True)
        for micro in range(K):
            lo = base + (micro * world + rank) * args.micro_batch
            idx = seqs[lo:lo + args.micro_batch]
            a = adv[lo:lo + args.micro_batch]

            with torch.no_grad():
                _, ref_lp = token_logprobs(ref(idx), idx)
            # the reference never trains (its frozen weights get no grad)

            sync = contextlib.nullcontext() if micro == K - 1 else model.no_sync()
            with sync:
                tok_lp, lp = token_logprobs(model(idx), idx)
                pg = -(a[:, None] * tok_lp).mean()
                kl = (lp.exp() * (lp - ref_lp)).sum(-1).mean()
                loss = (pg + args.kl_coef * kl) / K
                loss.backward()
        opt.step()
        if rank == 0:
            print(f"update {update} loss {loss.item() * K:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
