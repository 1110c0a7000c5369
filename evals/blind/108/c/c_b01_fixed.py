"""PPO actor-critic on 2 DDP ranks.

Actor and critic are separate networks, each wrapped in its own DDP and owned by
its own Adam.  Every rollout is split into minibatches; K minibatches form one
optimizer window, and the all-reduce is deferred to the window's last backward.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

OBS_DIM, N_ACT = 10, 5


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--rollouts", type=int, default=6)
    p.add_argument("--rollout-len", type=int, default=64)
    p.add_argument("--minibatch", type=int, default=16)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--ppo-epochs", type=int, default=2)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--actor-lr", type=float, default=3e-3)
    p.add_argument("--critic-lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS_DIM, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.pi = nn.Linear(32, N_ACT)

    def forward(self, obs):
        return self.pi(self.body(obs))


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


def env_step_reward(obs, act):
    # a fixed synthetic "environment": reward prefers the action matching a hashed feature
    target = (obs[:, :N_ACT].argmax(-1) + 1) % N_ACT
    return (act == target).float() + 0.1 * obs[:, -1]


@torch.no_grad()
def collect(actor, critic, it, rank, n):
    g = torch.Generator().manual_seed(1000 * it + 17 * rank + 3)
    obs = torch.randn(n, OBS_DIM, generator=g)
    logits = actor(obs)
    act = torch.multinomial(F.softmax(logits, -1), 1, generator=g).squeeze(-1)
    logp = F.log_softmax(logits, -1).gather(-1, act[:, None]).squeeze(-1)
    rew = env_step_reward(obs, act)
    val = critic(obs)
    adv = rew - val
    ret = rew
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)   # whole-rollout whitening
    return dict(obs=obs, act=act, logp=logp, adv=adv, ret=ret)


def ppo_losses(actor, critic, mb, a):
    logits = actor(mb["obs"])
    logp_all = F.log_softmax(logits, -1)
    logp = logp_all.gather(-1, mb["act"][:, None]).squeeze(-1)
    ratio = torch.exp(logp - mb["logp"])
    s1 = ratio * mb["adv"]
    s2 = torch.clamp(ratio, 1 - a.clip_eps, 1 + a.clip_eps) * mb["adv"]
    pg = -torch.min(s1, s2).mean()
    ent = -(logp_all.exp() * logp_all).sum(-1).mean()
    v = critic(mb["obs"])
    vf = F.mse_loss(v, mb["ret"])
    return pg - a.ent_coef * ent, a.vf_coef * vf


def main():
    a = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)

    actor = DDP(Actor())
    critic = DDP(Critic())
    actor_opt = torch.optim.Adam(actor.parameters(), lr=a.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=a.critic_lr)
    K = a.accum

    for it in range(a.rollouts):
        buf = collect(actor.module, critic.module, it, rank, a.rollout_len)
        n_mb = a.rollout_len // a.minibatch
        for ep in range(a.ppo_epochs):
            perm = torch.randperm(a.rollout_len, generator=torch.Generator().manual_seed(it * 31 + ep + rank))
            for j in range(n_mb):
                idx = perm[j * a.minibatch:(j + 1) * a.minibatch]
                mb = {k: v[idx] for k, v in buf.items()}
                sync = (j + 1) % K == 0
                with contextlib.ExitStack() as stack:
                    if not sync:
                        stack.enter_context(actor.no_sync())
                        stack.enter_context(critic.no_sync())
                    pi_loss, v_loss = ppo_losses(actor, critic, mb, a)
                    (pi_loss / K).backward()
                    (v_loss / K).backward()
                if sync:
                    actor_opt.step()
                    critic_opt.step()
                    actor_opt.zero_grad(set_to_none=True)
                    critic_opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    flat = []
    for m in (actor.module, critic.module):
        for _, p in m.named_parameters():
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
