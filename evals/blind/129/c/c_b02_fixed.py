"""Contextual-bandit REINFORCE on 2 ranks, data parallel by hand.

No DDP wrapper: every rank accumulates K micro-batches locally and the
gradients are averaged over ranks once per window with one flat bucket
(the same trick Megatron/Apex used before DDP buckets existed).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass
class Cfg:
    obs_dim: int = 12
    n_actions: int = 6
    hidden: int = 64
    micro_bsz: int = 16
    grad_accum: int = 4
    updates: int = 20
    lr: float = 3e-3
    entropy_coef: float = 0.01
    seed: int = 1234


class Policy(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.obs_dim, c.hidden), nn.Tanh(),
                                  nn.Linear(c.hidden, c.hidden), nn.Tanh())
        self.logits = nn.Linear(c.hidden, c.n_actions)

    def forward(self, obs):
        return self.logits(self.body(obs))


class Bandit:
    """Reward = <w_a, obs> + noise; fixed per seed, different stream per rank."""

    def __init__(self, c: Cfg, rank: int):
        g = torch.Generator().manual_seed(c.seed)
        self.w = torch.randn(c.n_actions, c.obs_dim, generator=g)
        self.gen = torch.Generator().manual_seed(c.seed + 1000 * (rank + 1))
        self.c = c

    def observe(self):
        return torch.randn(self.c.micro_bsz, self.c.obs_dim, generator=self.gen)

    def reward(self, obs, act):
        r = (self.w[act] * obs).sum(-1)
        return r + 0.1 * torch.randn(r.shape, generator=self.gen)


def allreduce_gradients(params, world_size):
    grads = [p.grad for p in params if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world_size)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def micro_loss(policy, env, c: Cfg):
    obs = env.observe()
    dist_ = torch.distributions.Categorical(logits=policy(obs))
    act = torch.multinomial(dist_.probs.detach(), 1, generator=env.gen).squeeze(-1)
    rew = env.reward(obs, act)
    adv = rew - rew.mean()
    pg = -(dist_.log_prob(act) * adv).mean()
    ent = dist_.entropy().mean()
    return pg - c.entropy_coef * ent


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Cfg()
    torch.manual_seed(c.seed)
    torch.use_deterministic_algorithms(True)
    policy = Policy(c)
    opt = torch.optim.Adam(policy.parameters(), lr=c.lr)
    env = Bandit(c, rank)
    params = list(policy.parameters())

    for update in range(c.updates):
        opt.zero_grad(set_to_none=True)
        for _ in range(c.grad_accum):
            loss = micro_loss(policy, env, c) / c.grad_accum
            loss.backward()
        allreduce_gradients(params, world)
        opt.step()

    sha = param_sha(policy)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
