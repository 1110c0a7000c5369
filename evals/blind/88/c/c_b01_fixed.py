"""DDPG-style actor-critic trained on 2 ranks with gradient accumulation.

Each rank draws K micro-batches of transitions per update; gradients of both
networks are averaged across ranks by hand once per window.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

OBS, ACT = 8, 2
MICRO_BS = 16
ACCUM = 4
UPDATES = 16
GAMMA = 0.9


def mlp(inp, out, hidden=32):
    return nn.Sequential(nn.Linear(inp, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, out))


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class ReplaySampler:
    def __init__(self, rank):
        self.rank = rank
        self.w = torch.linspace(-1, 1, OBS)

    def sample(self, update, micro):
        g = torch.Generator().manual_seed(10_000 * self.rank + 100 * update + micro)
        s = torch.randn(MICRO_BS, OBS, generator=g)
        a = torch.rand(MICRO_BS, ACT, generator=g) * 2 - 1
        r = (s @ self.w) * a[:, 0] - 0.5 * a[:, 1] ** 2 + 0.1 * torch.randn(MICRO_BS, generator=g)
        s2 = 0.8 * s + 0.3 * torch.randn(MICRO_BS, OBS, generator=g)
        return s, a, r, s2


class DDPGLearner:
    def __init__(self, world_size):
        torch.manual_seed(0)
        self.world_size = world_size
        self.nets = nn.ModuleDict({"actor": mlp(OBS, ACT), "critic": mlp(OBS + ACT, 1)})
        self.actor_opt = torch.optim.Adam(self.nets["actor"].parameters(), lr=3e-3)
        self.critic_opt = torch.optim.Adam(self.nets["critic"].parameters(), lr=3e-3)

    def act(self, s):
        return torch.tanh(self.nets["actor"](s))

    def q(self, s, a):
        return self.nets["critic"](torch.cat([s, a], dim=-1)).squeeze(-1)

    def accumulate(self, batch):
        s, a, r, s2 = batch
        # policy improvement: push actions towards higher Q (critic held fixed)
        self.nets["critic"].requires_grad_(False)
        actor_loss = -self.q(s, self.act(s)).mean()
        (actor_loss / ACCUM).backward()
        self.nets["critic"].requires_grad_(True)

        with torch.no_grad():
            target = r + GAMMA * self.q(s2, self.act(s2))
        critic_loss = F.mse_loss(self.q(s, a), target)
        (critic_loss / ACCUM).backward()
        return actor_loss.item(), critic_loss.item()

    def sync_grads(self):
        for p in self.nets.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(self.world_size)

    def apply(self):
        self.sync_grads()
        self.actor_opt.step()
        self.critic_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    learner = DDPGLearner(world)
    sampler = ReplaySampler(rank)
    for update in range(UPDATES):
        for micro in range(ACCUM):
            al, cl = learner.accumulate(sampler.sample(update, micro))
        learner.apply()
        if rank == 0 and update % 4 == 0:
            print(f"update {update} actor {al:.4f} critic {cl:.4f}")
    if rank == 0:
        print("FINAL_SHA256", final_sha(learner.nets))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
