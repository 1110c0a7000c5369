"""RLOO policy-gradient fine-tuning of a tiny policy on a synthetic contextual bandit.

Two ranks are spawned by this script; there is no DDP wrapper, gradients are averaged
by hand once per optimizer step (after K micro-batches of rollouts).
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD_SIZE = 2
PORT = 47202
OBS_DIM, N_ACTIONS = 12, 6
PROMPTS_PER_MICRO = 4
SAMPLES_PER_PROMPT = 4
GRAD_ACCUM = 4
TOTAL_STEPS = 20
LR = 3e-3


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS_DIM, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, N_ACTIONS)

    def forward(self, obs):
        return self.pi(self.body(obs))


def reward_fn(obs, actions, w_true):
    scores = obs @ w_true  # (P, A)
    return scores.gather(1, actions)  # (P, S)


def rloo_advantages(rewards):
    # leave-one-out baseline inside each prompt's group of samples
    s = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (s - 1)
    return rewards - baseline


def average_gradients(model, world_size):
    for param in model.parameters():
        if param.grad is None:
            continue
        param.grad.data /= world_size
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)


def rollout_loss(policy, obs, gen, w_true):
    logits = policy(obs)
    with torch.no_grad():
        probs = F.softmax(logits, dim=-1)
        actions = torch.multinomial(probs, SAMPLES_PER_PROMPT, replacement=True, generator=gen)
        adv = rloo_advantages(reward_fn(obs, actions, w_true))
    logp = F.log_softmax(logits, dim=-1).gather(1, actions)
    return -(adv * logp).mean()


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    policy = Policy()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.01)
    w_true = torch.randn(OBS_DIM, N_ACTIONS, generator=torch.Generator().manual_seed(1234))

    for step in range(TOTAL_STEPS):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(GRAD_ACCUM):
            gen = torch.Generator().manual_seed(100_000 + 1000 * step + 10 * micro + rank)
            obs = torch.randn(PROMPTS_PER_MICRO, OBS_DIM, generator=gen)
            loss = rollout_loss(policy, obs, gen, w_true) / GRAD_ACCUM
            loss.backward()
        average_gradients(policy, WORLD_SIZE)
        optimizer.step()

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD_SIZE, join=True)
