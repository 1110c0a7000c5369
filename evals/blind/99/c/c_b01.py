"""GRPO with DAPO-style dynamic sampling on a toy "count the lucky token" task.

Two ranks are spawned with torch.multiprocessing; the policy is wrapped in DDP.
Each optimizer step consumes a window of GRAD_ACCUM rollout micro-batches per
rank.  Groups whose G completions all got the same reward carry no signal and
are filtered out (dynamic sampling), so the number of kept completion tokens
differs from micro-batch to micro-batch and from rank to rank.

Loss: DAPO token-level policy-gradient loss, i.e. every kept completion token
of the window (all ranks) weighs the same.
"""
import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class GRPOConfig:
    vocab: int = 12
    d_model: int = 32
    prompt_len: int = 4
    max_new: int = 7
    group_size: int = 4
    prompts_per_micro: int = 3
    grad_accum: int = 2
    num_updates: int = 12
    lr: float = 3e-3
    eos: int = 0
    lucky: int = 5
    seed: int = 1234
    port: int = 49201


class TinyPolicy(nn.Module):
    def __init__(self, cfg: GRPOConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.prompt_len + cfg.max_new, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, 4, 64, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, ids):
        T = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        h = self.body(h, mask=mask, is_causal=True)
        return self.head(h)


@torch.no_grad()
def rollout(policy, cfg, gen):
    """Sample G completions for each prompt; returns ids, completion mask, rewards."""
    P, G = cfg.prompts_per_micro, cfg.group_size
    prompts = torch.randint(1, cfg.vocab, (P, cfg.prompt_len), generator=gen)
    ids = prompts.repeat_interleave(G, dim=0)
    alive = torch.ones(P * G, dtype=torch.bool)
    cmask = []
    for _ in range(cfg.max_new):
        logits = policy(ids)[:, -1].float()
        nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=gen).squeeze(1)
        nxt = torch.where(alive, nxt, torch.full_like(nxt, cfg.eos))
        cmask.append(alive.clone())
        alive = alive & (nxt != cfg.eos)
        ids = torch.cat([ids, nxt[:, None]], 1)
    cmask = torch.stack(cmask, 1).float()
    comp = ids[:, cfg.prompt_len:]
    hits = ((comp == cfg.lucky).float() * cmask).sum(1)
    reward = (hits >= 1).float()
    return ids, cmask, reward


def group_advantages(reward, G):
    r = reward.view(-1, G)
    std = r.std(1, keepdim=True)
    adv = (r - r.mean(1, keepdim=True)) / (std + 1e-4)
    keep = (std > 0).expand_as(r)                     # dynamic sampling filter
    return adv.reshape(-1), keep.reshape(-1).float()


def token_pg_loss(policy, ids, cmask, adv, keep, cfg):
    logits = policy(ids[:, :-1])[:, cfg.prompt_len - 1:]
    logp = torch.log_softmax(logits.float(), -1)
    tgt = ids[:, cfg.prompt_len:]
    lp = logp.gather(-1, tgt[..., None]).squeeze(-1)
    ratio = torch.exp(lp - lp.detach())
    per_tok = -adv[:, None] * ratio
    m = cmask * keep[:, None]
    return per_tok, m


def worker(rank, world, cfg: GRPOConfig):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    policy = DDP(TinyPolicy(cfg))
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 97 * rank)

    for update in range(cfg.num_updates):
        # collect the whole window of rollouts with the current policy
        window = []
        for _ in range(cfg.grad_accum):
            ids, cmask, reward = rollout(policy.module, cfg, gen)
            adv, keep = group_advantages(reward, cfg.group_size)
            window.append((ids, cmask, adv, keep))
        n_tok = torch.tensor(sum(float((c * k[:, None]).sum()) for _, c, _, k in window))
        dist.all_reduce(n_tok)                          # kept tokens, whole window, all ranks
        n_tok.clamp_(min=1.0)
        for i, (ids, cmask, adv, keep) in enumerate(window):
            last = i == cfg.grad_accum - 1
            with (nullcontext() if last else policy.no_sync()):
                per_tok, m = token_pg_loss(policy, ids, cmask, adv, keep, cfg)
                loss = (per_tok * m).sum() / m.sum().clamp(min=1.0) / cfg.grad_accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and update % 4 == 0:
            print(f"update {update} kept_tokens {int(n_tok)}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=GRPOConfig.port)
    ap.add_argument("--updates", type=int, default=GRPOConfig.num_updates)
    a = ap.parse_args()
    torch.set_num_threads(1)
    mp.spawn(worker, args=(2, GRPOConfig(port=a.port, num_updates=a.updates)), nprocs=2, join=True)
