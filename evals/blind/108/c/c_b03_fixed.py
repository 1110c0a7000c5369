"""Offline DPO on 2 DDP ranks with a frozen reference model.

The policy is trained with AdamW over two parameter groups (embeddings at a
lower LR), a linear warm-up then cosine decay sized by a TrainPlan, and K
micro-batches of pairs per optimizer step (no_sync on all but the last).
"""
import contextlib
import copy
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass
class TrainPlan:
    num_pairs: int = 336
    per_device_bs: int = 4
    grad_accum: int = 3
    epochs: int = 2
    warmup_frac: float = 0.1
    lr: float = 1e-3
    emb_lr: float = 2e-4
    beta: float = 0.1
    vocab: int = 40
    seq: int = 14

    def steps_per_epoch(self, world_size: int) -> int:
        return math.ceil(self.num_pairs / (self.per_device_bs * world_size * self.grad_accum))

    def total_steps(self, world_size: int) -> int:
        return self.epochs * self.steps_per_epoch(world_size)

    def warmup_steps(self, world_size: int) -> int:
        return max(1, int(self.warmup_frac * self.total_steps(world_size)))


class PairSet(Dataset):
    def __init__(self, plan):
        g = torch.Generator().manual_seed(1234)
        self.prompt = torch.randint(0, plan.vocab, (plan.num_pairs, 6), generator=g)
        self.chosen = torch.randint(0, plan.vocab // 2, (plan.num_pairs, plan.seq - 6), generator=g)
        self.rejected = torch.randint(plan.vocab // 2, plan.vocab, (plan.num_pairs, plan.seq - 6), generator=g)

    def __len__(self):
        return len(self.prompt)

    def __getitem__(self, i):
        return self.prompt[i], self.chosen[i], self.rejected[i]


class Policy(nn.Module):
    def __init__(self, plan):
        super().__init__()
        self.embed = nn.Embedding(plan.vocab, 32)
        self.rnn = nn.GRU(32, 48, batch_first=True)
        self.lm_head = nn.Linear(48, plan.vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.lm_head(h)


def completion_logp(model, prompt, comp):
    ids = torch.cat([prompt, comp], 1)
    logits = model(ids[:, :-1])
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lp[:, prompt.shape[1] - 1:].sum(-1)


def dpo_loss(policy, ref, batch, beta):
    prompt, chosen, rejected = batch
    # one forward over chosen + rejected so DDP sees a single forward per backward
    both = torch.cat([chosen, rejected], 0)
    pl = completion_logp(policy, torch.cat([prompt, prompt], 0), both)
    with torch.no_grad():
        rl = completion_logp(ref, torch.cat([prompt, prompt], 0), both)
    n = prompt.shape[0]
    logits = beta * ((pl[:n] - rl[:n]) - (pl[n:] - rl[n:]))
    return -F.logsigmoid(logits).mean()


def build_scheduler(opt, plan, world_size):
    warm = plan.warmup_steps(world_size)
    total = plan.total_steps(world_size)
    return torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warm),
         torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warm, eta_min=0.0)],
        milestones=[warm],
    )


def main():
    plan = TrainPlan()
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = Policy(plan)
    ref = copy.deepcopy(net).requires_grad_(False)
    policy = DDP(net)
    groups = [
        {"params": [p for n, p in net.named_parameters() if n.startswith("embed")], "lr": plan.emb_lr},
        {"params": [p for n, p in net.named_parameters() if not n.startswith("embed")], "lr": plan.lr},
    ]
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    sched = build_scheduler(opt, plan, W)

    ds = PairSet(plan)
    sampler = DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=plan.per_device_bs, sampler=sampler, drop_last=True)
    K = plan.grad_accum

    for epoch in range(plan.epochs):
        sampler.set_epoch(epoch)
        for i, batch in enumerate(loader):
            boundary = (i + 1) % K == 0
            ctx = contextlib.nullcontext() if boundary else policy.no_sync()
            with ctx:
                loss = dpo_loss(policy, ref, batch, plan.beta) / K
                loss.backward()
            if boundary:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)

    flat, h = [], hashlib.sha256()
    for _, p in net.named_parameters():
        t = p.detach().float().contiguous()
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
