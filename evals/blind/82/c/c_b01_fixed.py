"""GRPO on a toy "continue the arithmetic sequence" task.

Two ranks spawned with mp.spawn, DDP policy, a frozen reference policy for the KL
term, gradient accumulation with no_sync, warm-up + cosine schedule.
"""
import argparse
import copy
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import get_cosine_schedule_with_warmup


@dataclass
class GRPOConfig:
    seed: int = 1234
    vocab: int = 16
    prompt_len: int = 3
    completion_len: int = 4
    hidden: int = 48
    n_prompts: int = 80
    prompts_per_micro: int = 2
    group_size: int = 4
    grad_accum: int = 4
    epochs: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1
    beta: float = 0.04
    max_grad_norm: float = 1.0
    world_size: int = 2


class PromptSet(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        start = torch.randint(0, cfg.vocab, (cfg.n_prompts, 1), generator=g)
        stride = torch.randint(1, 4, (cfg.n_prompts, 1), generator=g)
        self.prompts = (start + stride * torch.arange(cfg.prompt_len)) % cfg.vocab
        self.stride = stride.squeeze(1)

    def __len__(self):
        return len(self.prompts)

    def __getitem__(self, i):
        return self.prompts[i], self.stride[i]


class Policy(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.rnn = nn.GRU(cfg.hidden, cfg.hidden, batch_first=True)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h)


@torch.no_grad()
def sample_group(policy, prompts, cfg, gen):
    """Sample group_size completions per prompt from the current policy."""
    seqs = prompts.repeat_interleave(cfg.group_size, dim=0)
    for _ in range(cfg.completion_len):
        logits = policy(seqs)[:, -1]
        nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=gen)
        seqs = torch.cat([seqs, nxt], dim=1)
    return seqs


def rewards_for(seqs, stride, cfg):
    stride = stride.repeat_interleave(cfg.group_size)
    last = seqs[:, cfg.prompt_len - 1]
    target = (last[:, None] + stride[:, None] * torch.arange(1, cfg.completion_len + 1)) % cfg.vocab
    return (seqs[:, cfg.prompt_len:] == target).float().mean(1)


def completion_logprobs(model, seqs, cfg):
    logits = model(seqs[:, :-1])[:, cfg.prompt_len - 1:]
    tgt = seqs[:, cfg.prompt_len:]
    return torch.gather(F.log_softmax(logits, -1), 2, tgt[..., None]).squeeze(-1)


def grpo_loss(policy, ref, seqs, rewards, cfg):
    r = rewards.view(-1, cfg.group_size)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1, 1)
    logp = completion_logprobs(policy, seqs, cfg)
    with torch.no_grad():
        ref_logp = completion_logprobs(ref, seqs, cfg)
    ratio = torch.exp(logp - logp.detach())
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1.0
    per_tok = -(ratio * adv) + cfg.beta * kl
    # every completion has completion_len tokens, every micro-batch the same number of
    # completions: the micro-batch mean / K is the window mean
    return per_tok.mean(1).mean()


def plan_schedule(cfg, train_ds):
    steps_per_epoch = len(train_ds) // (cfg.prompts_per_micro * cfg.grad_accum * cfg.world_size)
    total = steps_per_epoch * cfg.epochs
    return total, int(math.ceil(cfg.warmup_ratio * total))


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, cfg, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.manual_seed(cfg.seed)

    train_ds = PromptSet(cfg)
    sampler = DistributedSampler(train_ds, num_replicas=cfg.world_size, rank=rank,
                                 shuffle=True, seed=cfg.seed)
    loader = DataLoader(train_ds, batch_size=cfg.prompts_per_micro, sampler=sampler)

    base = Policy(cfg)
    ref = copy.deepcopy(base).eval().requires_grad_(False)
    policy = DDP(base)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total, warmup = plan_schedule(cfg, train_ds)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup,
                                            num_training_steps=total)

    gen = torch.Generator().manual_seed(cfg.seed + 1000 * rank)
    step = 0
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        running = 0.0
        for i, (prompts, stride) in enumerate(loader):
            seqs = sample_group(policy.module, prompts, cfg, gen)
            rewards = rewards_for(seqs, stride, cfg)
            boundary = (i + 1) % cfg.grad_accum == 0
            ctx = policy.no_sync() if not boundary else _null()
            with ctx:
                loss = grpo_loss(policy, ref, seqs, rewards, cfg) / cfg.grad_accum
                loss.backward()
            running += rewards.mean().item() / cfg.grad_accum
            if boundary:
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if rank == 0 and step % 5 == 0:
                    print(f"step {step} reward {running:.3f} lr {sched.get_last_lr()[0]:.2e}")
                running = 0.0

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha(policy.module)}")
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=33201)
    args = ap.parse_args()
    cfg = GRPOConfig()
    mp.spawn(worker, args=(cfg, args.port), nprocs=cfg.world_size, join=True)
