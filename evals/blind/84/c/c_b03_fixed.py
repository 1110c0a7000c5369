"""RLOO (REINFORCE leave-one-out) fine-tuning of a tiny policy LM on 2 DDP ranks, bf16 autocast.

Rollout phase: every rank samples K micro-batches of G completions per prompt with the
current policy. Completions stop at EOS, so they have different lengths. Train phase:
a token-level policy-gradient loss over the window, normalised by the number of
completion tokens in the window, one optimizer step per window.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, EOS, PROMPT_LEN, MAX_NEW = 48, 0, 6, 14
PROMPTS_PER_MICRO, GROUP = 2, 4
GRAD_ACCUM = 3
ITERATIONS = 10
LR = 1e-3
CLIP = 1.0


class Policy(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(PROMPT_LEN + MAX_NEW, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.size(1)))
        h, _ = self.rnn(x)
        return self.head(h)


def reward_fn(completion, mask):
    # reward tokens that are "even" and short, clean answers
    good = ((completion % 2 == 0) & (completion != EOS) & mask).float().sum(1)
    return good / MAX_NEW - 0.02 * mask.float().sum(1)


@torch.no_grad()
def rollout(policy, gen):
    prompts = torch.randint(1, VOCAB, (PROMPTS_PER_MICRO, PROMPT_LEN), generator=gen)
    ids = prompts.repeat_interleave(GROUP, dim=0)
    done = torch.zeros(ids.size(0), dtype=torch.bool)
    mask = []
    for _ in range(MAX_NEW):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = policy(ids)[:, -1].float()
        probs = F.softmax(logits, -1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        mask.append(~done)
        nxt = torch.where(done, torch.full_like(nxt, EOS), nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done = done | (nxt == EOS)
    mask = torch.stack(mask, 1)
    comp = ids[:, PROMPT_LEN:]
    r = reward_fn(comp, mask).view(PROMPTS_PER_MICRO, GROUP)
    baseline = (r.sum(1, keepdim=True) - r) / (GROUP - 1)
    adv = (r - baseline).view(-1)
    return ids, mask, adv


def pg_loss_sum(model, ids, mask, adv):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids[:, :-1])
    logp = torch.log_softmax(logits.float(), -1)
    tgt = ids[:, 1:]
    tok_logp = logp.gather(-1, tgt[..., None]).squeeze(-1)[:, PROMPT_LEN - 1:]
    return -(adv[:, None] * tok_logp * mask).sum()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    policy = Policy()
    model = DDP(policy)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1234 + rank)

    for it in range(ITERATIONS):
        window = [rollout(policy, gen) for _ in range(GRAD_ACCUM)]
        n_tok = sum(m.sum() for _, m, _ in window).float()
        dist.all_reduce(n_tok)  # completion tokens of the window on all ranks
        n_tok = n_tok / world  # DDP averages the ranks' gradients
        for k, (ids, mask, adv) in enumerate(window):
            model.require_backward_grad_sync = k == GRAD_ACCUM - 1
            loss = pg_loss_sum(model, ids, mask, adv) / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and it % 3 == 0:
            mean_r = torch.stack([a for _, _, a in window]).abs().mean().item()
            print(f"iter {it} tokens {int(n_tok)} |adv| {mean_r:.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in policy.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
