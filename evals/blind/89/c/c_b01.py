"""GRPO-style policy update on spawned ranks (no DDP wrapper).

Each optimizer step consumes a window of K micro-batches of prompts per rank.
Completions stop at an EOS token, so rank/micro-batch token counts differ; the
loss is a token sum divided by the window's completion-token count over all
ranks, and gradients are summed across ranks once per window by hand.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass
class GRPOConfig:
    vocab: int = 24
    d_model: int = 32
    prompt_len: int = 4
    max_new: int = 8
    group_size: int = 4
    prompts_per_micro: int = 2
    grad_accum: int = 4
    num_updates: int = 10
    lr: float = 2e-3
    max_grad_norm: float = 1.0
    eos: int = 0
    target: int = 5
    port: int = 41201


class Policy(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.rnn = nn.GRU(cfg.d_model, cfg.d_model, batch_first=True)
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(self.ln(h))


@torch.no_grad()
def rollout(policy, cfg, gen):
    n = cfg.prompts_per_micro
    prompts = torch.randint(1, cfg.vocab, (n, cfg.prompt_len), generator=gen)
    ids = prompts.repeat_interleave(cfg.group_size, 0)
    done = torch.zeros(ids.size(0), dtype=torch.bool)
    mask = []
    for _ in range(cfg.max_new):
        logits = policy(ids)[:, -1].float()
        nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=gen).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, cfg.eos), nxt)
        mask.append(~done)
        done = done | (nxt == cfg.eos)
        ids = torch.cat([ids, nxt[:, None]], 1)
    mask = torch.stack(mask, 1).float()
    comp = ids[:, cfg.prompt_len:]
    reward = ((comp == cfg.target).float() * mask).sum(1) - 0.1 * mask.sum(1)
    r = reward.view(n, cfg.group_size)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    return ids, mask, adv.view(-1)


def sync_gradients(model):
    params = (p for p in model.parameters() if p.grad is not None)
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
        p.grad.copy_(g)


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    policy = Policy(cfg)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1000 + rank)

    for update in range(cfg.num_updates):
        window = [rollout(policy, cfg, gen) for _ in range(cfg.grad_accum)]
        n_tok = torch.tensor([sum(m.sum() for _, m, _ in window)])
        dist.all_reduce(n_tok)
        opt.zero_grad(set_to_none=True)
        for ids, mask, adv in window:
            logits = policy(ids[:, :-1])[:, cfg.prompt_len - 1:]
            logp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, cfg.prompt_len:, None]).squeeze(2)
            ratio = torch.exp(logp - logp.detach())
            per_tok = -ratio * adv[:, None]
            loss = (per_tok * mask).sum() / n_tok
            loss.backward()
        sync_gradients(policy)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        opt.step()

    if rank == 0:
        print(f"FINAL_SHA256 {fingerprint(policy)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = GRPOConfig()
    mp.spawn(worker, args=(2, cfg), nprocs=2, join=True)
