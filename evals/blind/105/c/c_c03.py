"""GRPO-style policy update with a frozen reference policy, token-level normalisation.

torchrun, 2 ranks, DDP + no_sync. Every window's loss is the sum over all completion tokens
of the window on all ranks, divided by that all-ranks token count (DAPO-style token-level
mean). DDP averages gradients over ranks, which would leave the result 1/W too small, so the
averaged gradient is summed once more across ranks (identical copies -> x W) before the clip.
"""
import hashlib
import os
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = SimpleNamespace(
    vocab=16, prompt_len=4, max_new=10, group=4, groups_per_micro=2,
    accum=2, updates=16, lr=3e-3, beta=0.04, clip_eps=0.2, max_grad_norm=1.0, seed=99,
)


class Policy(nn.Module):
    def __init__(self, vocab, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h).log_softmax(-1)


def token_logps(model, seq):
    logp = model(seq[:, :-1])
    return logp.gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)     # (B, L-1)


def make_rollouts(gen, cfg):
    """Groups of completions for the same prompt, ragged lengths, reward = share of even tokens."""
    n_groups = cfg.groups_per_micro
    prompts = torch.randint(0, cfg.vocab, (n_groups, cfg.prompt_len), generator=gen)
    prompts = prompts.repeat_interleave(cfg.group, 0)
    comp = torch.randint(0, cfg.vocab, (prompts.size(0), cfg.max_new), generator=gen)
    lengths = torch.randint(2, cfg.max_new + 1, (prompts.size(0),), generator=gen)
    comp_mask = (torch.arange(cfg.max_new)[None] < lengths[:, None]).float()
    reward = ((comp % 2 == 0).float() * comp_mask).sum(1) / lengths
    r = reward.view(n_groups, cfg.group)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    seq = torch.cat([prompts, comp], 1)
    mask = torch.cat([torch.zeros(prompts.size(0), cfg.prompt_len - 1), comp_mask], 1)   # aligned to seq[:, 1:]
    return seq, mask, adv


def grpo_token_loss(logp, old_logp, ref_logp, adv, mask, cfg):
    ratio = torch.exp(logp - old_logp)
    pg = -torch.min(ratio * adv[:, None], ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv[:, None])
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return ((pg + cfg.beta * kl) * mask).sum()


def main():
    cfg = CFG
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)

    policy = Policy(cfg.vocab)
    ref = Policy(cfg.vocab)
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False).eval()
    # the reference drifts from the policy only through training; give it a head start
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model = DDP(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)

    for update in range(cfg.updates):
        window = [make_rollouts(gen, cfg) for _ in range(cfg.accum)]
        n_tok = torch.tensor(sum(m.sum() for _, m, _ in window))
        dist.all_reduce(n_tok)

        for i, (seq, mask, adv) in enumerate(window):
            with torch.no_grad():
                old_logp = token_logps(policy, seq)
                ref_logp = token_logps(ref, seq)
            with (model.no_sync() if i < cfg.accum - 1 else nullcontext()):
                logp = token_logps(model, seq)
                loss = grpo_token_loss(logp, old_logp, ref_logp, adv, mask, cfg) / n_tok
                loss.backward()

        # DDP has averaged over ranks; the objective wants the sum over ranks.
        for p in policy.parameters():
            dist.all_reduce(p.grad)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and update % 5 == 0:
            print(f"update {update} tokens {int(n_tok)} last loss {loss.item():.5f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
