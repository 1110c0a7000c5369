"""DAPO-style policy-gradient fine-tuning of a tiny GRU policy, DDP on 2 ranks, hand loop.

Loss is token-level (every response token of the batch weighs the same, as in DAPO),
responses have very different lengths. Rollouts are synthetic and precomputed.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, SEQ, PROMPT = 48, 28, 6
MICRO_BS, GRAD_ACCUM, STEPS, LR, SEED = 4, 4, 8, 1e-3, 99


class GRUPolicy(nn.Module):
    def __init__(self, vocab=VOCAB, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


def make_rollouts(rank, n):
    g = torch.Generator().manual_seed(SEED * 31 + rank)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    resp_len = torch.randint(2, SEQ - PROMPT, (n,), generator=g)
    pos = torch.arange(SEQ - 1)
    # mask over the shifted targets: response tokens only, right padding after
    mask = ((pos >= PROMPT - 1) & (pos < PROMPT - 1 + resp_len[:, None])).float()
    reward = torch.rand(n, generator=g)
    adv = (reward - 0.5) / 0.29
    return ids, mask, adv


def pg_loss(policy, ids, mask, adv):
    logits = policy(ids[:, :-1])
    logp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    per_tok = -ratio * adv[:, None]
    # token-level sum (DAPO): each response token counts once; normalised by the caller
    return (per_tok * mask).sum()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    policy = DDP(GRUPolicy())
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    ids, mask, adv = make_rollouts(rank, STEPS * GRAD_ACCUM * MICRO_BS)

    for step in range(STEPS):
        base = step * GRAD_ACCUM * MICRO_BS
        window = [slice(base + k * MICRO_BS, base + (k + 1) * MICRO_BS) for k in range(GRAD_ACCUM)]
        n_tok = torch.stack([mask[sl].sum() for sl in window]).sum()
        dist.all_reduce(n_tok)
        for k, sl in enumerate(window):
            sync = k == GRAD_ACCUM - 1
            policy.require_backward_grad_sync = sync
            loss = pg_loss(policy, ids[sl], mask[sl], adv[sl]) * world / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 2 == 1:
            print(f"step {step + 1} loss {loss.item():.4f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
