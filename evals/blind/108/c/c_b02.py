"""GRPO on 2 ranks with FSDP2 (fully_shard) and a frozen reference policy.

Each rollout produces a fixed number of micro-batches per rank (groups of G
completions per prompt).  K micro-batches form one window; the loss is the
window's token sum over the all-ranks completion-token count, times W (FSDP2
averages over ranks).  The gradient reduce-scatter is deferred to the window's
last micro-batch.
"""
import copy
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class GRPOConfig:
    vocab: int = 32
    dim: int = 48
    prompt_len: int = 6
    max_completion: int = 10
    group_size: int = 4
    prompts_per_mb: int = 2
    mbs_per_rollout: int = 5
    grad_accum: int = 2
    rollouts: int = 5
    lr: float = 2e-3
    beta: float = 0.04
    clip_eps: float = 0.2
    seed: int = 11


class TinyLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Parameter(torch.randn(c.prompt_len + c.max_completion, c.dim) * 0.02)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, c.dim), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(c.dim, c.vocab)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.emb(ids) + self.pos[:T]
        # causal mixing: cumulative mean over previous positions
        x = torch.cumsum(x, 1) / torch.arange(1, T + 1, dtype=x.dtype)[None, :, None]
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def token_logps(model, ids):
    logits = model(ids[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def make_microbatch(c, rollout, j, rank):
    g = torch.Generator().manual_seed(100003 * rollout + 101 * j + rank)
    n = c.prompts_per_mb * c.group_size
    prompts = torch.randint(0, c.vocab, (c.prompts_per_mb, c.prompt_len), generator=g)
    prompts = prompts.repeat_interleave(c.group_size, 0)
    comp = torch.randint(0, c.vocab, (n, c.max_completion), generator=g)
    lens = torch.randint(2, c.max_completion + 1, (n,), generator=g)
    mask = (torch.arange(c.max_completion)[None] < lens[:, None]).float()
    reward = ((comp < c.vocab // 3).float() * mask).sum(1) / lens
    r = reward.view(c.prompts_per_mb, c.group_size)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    ids = torch.cat([prompts, comp], 1)
    full_mask = torch.cat([torch.zeros(n, c.prompt_len - 1), mask], 1)
    return ids, full_mask, adv


def grpo_token_loss_sum(policy, ref, ids, mask, adv, c):
    logp = token_logps(policy, ids)
    with torch.no_grad():
        ref_logp = token_logps(ref, ids)
    old = logp.detach()
    ratio = torch.exp(logp - old)
    pg = -torch.min(ratio * adv[:, None], ratio.clamp(1 - c.clip_eps, 1 + c.clip_eps) * adv[:, None])
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return ((pg + c.beta * kl) * mask).sum()


def main():
    c = GRPOConfig()
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c.seed)
    policy = TinyLM(c)
    ref = copy.deepcopy(policy).requires_grad_(False).eval()
    for blk in policy.blocks:
        fully_shard(blk)
    fully_shard(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=c.lr, weight_decay=0.01)
    K = c.grad_accum

    for rollout in range(c.rollouts):
        mbs = [make_microbatch(c, rollout, j, rank) for j in range(c.mbs_per_rollout)]
        for j, (ids, mask, adv) in enumerate(mbs):
            w0 = (j // K) * K
            if j == w0:
                cnt = torch.stack([m.sum() for _, m, _ in mbs[w0:w0 + K]]).sum()
                dist.all_reduce(cnt)
                denom = cnt.item()
            end_of_window = (j + 1) % K == 0
            policy.set_requires_gradient_sync(end_of_window)
            loss = grpo_token_loss_sum(policy, ref, ids, mask, adv, c) * W / denom
            loss.backward()
            if end_of_window:
                opt.step()
                opt.zero_grad()

    flat, h = [], hashlib.sha256()
    for _, p in policy.named_parameters():
        t = p.full_tensor().detach().float().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
