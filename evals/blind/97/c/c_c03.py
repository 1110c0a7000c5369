"""GRPO-style policy update on 2 DDP ranks (gloo) with a frozen reference model.

* the policy's vocabulary is grown by 4 special tokens before wrapping (embedding and head are
  resized, old rows copied), its first block is frozen;
* completions have uneven lengths; the loss is the sum of per-token (clipped surrogate + beta KL)
  over the window, divided by the window's completion-token count of all ranks, times the world
  size (DDP averages);
* forward and backward of the non-final micro-steps run under `no_sync()`.
"""
import argparse
import contextlib
import copy
import hashlib
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = SimpleNamespace(vocab=30, extra_tokens=4, d=40, prompt_len=4, max_completion=10,
                      group_size=4, prompts_per_micro=2, grad_accum=2, steps=8,
                      lr=1e-3, beta=0.04, eps_clip=0.2, max_grad_norm=1.0, seed=3)


class TinyPolicy(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.block0 = nn.GRU(d, d, batch_first=True)
        self.block1 = nn.Sequential(nn.Linear(d, d), nn.Tanh())
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, ids):
        h, _ = self.block0(self.embed(ids))
        return self.lm_head(self.block1(h))


def resize_vocab(model, new_vocab):
    old_e, old_h = model.embed, model.lm_head
    n_old = old_e.num_embeddings
    e = nn.Embedding(new_vocab, old_e.embedding_dim)
    h = nn.Linear(old_h.in_features, new_vocab)
    with torch.no_grad():
        e.weight[:n_old] = old_e.weight
        e.weight[n_old:] = old_e.weight.mean(0)
        h.weight[:n_old] = old_h.weight
        h.weight[n_old:] = 0.0
        h.bias[:n_old] = old_h.bias
        h.bias[n_old:] = -5.0
    model.embed, model.lm_head = e, h
    return model


def make_group_batch(cfg, rank, step, micro):
    """prompts x group completions, right padded; returns ids, completion mask, advantages."""
    g = torch.Generator().manual_seed(cfg.seed * 7 + rank * 1009 + step * 31 + micro)
    n = cfg.prompts_per_micro * cfg.group_size
    T = cfg.prompt_len + cfg.max_completion
    ids = torch.zeros(n, T, dtype=torch.long)
    mask = torch.zeros(n, T)
    rewards = torch.zeros(n)
    for p in range(cfg.prompts_per_micro):
        prompt = torch.randint(1, cfg.vocab, (cfg.prompt_len,), generator=g)
        for j in range(cfg.group_size):
            r = p * cfg.group_size + j
            L = int(torch.randint(1, cfg.max_completion + 1, (1,), generator=g))
            ids[r, :cfg.prompt_len] = prompt
            ids[r, cfg.prompt_len:cfg.prompt_len + L] = torch.randint(1, cfg.vocab + cfg.extra_tokens, (L,), generator=g)
            mask[r, cfg.prompt_len:cfg.prompt_len + L] = 1.0
            rewards[r] = (ids[r, cfg.prompt_len:cfg.prompt_len + L] % 3 == 0).float().mean()
    grp = rewards.view(cfg.prompts_per_micro, cfg.group_size)
    adv = ((grp - grp.mean(1, keepdim=True)) / (grp.std(1, keepdim=True) + 1e-4)).view(-1)
    return ids, mask, adv


def token_logps(model, ids):
    logits = model(ids[:, :-1])
    return torch.gather(F.log_softmax(logits.float(), -1), 2, ids[:, 1:, None]).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=CFG.steps)
    cfg = copy.copy(CFG)
    cfg.steps = ap.parse_args().steps
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(cfg.seed)
    base = TinyPolicy(cfg.vocab, cfg.d)
    policy = resize_vocab(base, cfg.vocab + cfg.extra_tokens)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    policy.block0.requires_grad_(False)
    model = DDP(policy)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)

    for step in range(cfg.steps):
        batches = [make_group_batch(cfg, rank, step, m) for m in range(cfg.grad_accum)]
        n_tok = torch.tensor(sum(m[:, 1:].sum() for _, m, _ in batches))
        dist.all_reduce(n_tok)
        with torch.no_grad():
            old = [token_logps(model.module, ids) for ids, _, _ in batches]
            ref = [token_logps(reference, ids) for ids, _, _ in batches]
        for m, (ids, mask, adv) in enumerate(batches):
            ctx = model.no_sync() if m < cfg.grad_accum - 1 else contextlib.nullcontext()
            with ctx:
                logp = token_logps(model, ids)
                ratio = torch.exp(logp - old[m])
                surr = torch.min(ratio * adv[:, None],
                                 torch.clamp(ratio, 1 - cfg.eps_clip, 1 + cfg.eps_clip) * adv[:, None])
                kl = torch.exp(ref[m] - logp) - (ref[m] - logp) - 1
                per_tok = (-surr + cfg.beta * kl) * mask[:, 1:]
                (per_tok.sum() * world / n_tok).backward()
        gn = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 2 == 0:
            print(f"step {step} tokens {int(n_tok)} grad_norm {gn.item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
