"""
PPO on a contextual bandit, 2 DDP ranks (torchrun, gloo).

Each rank collects `rollout_per_rank` transitions per iteration, then runs
`ppo_epochs` updates over that rollout. Every update is one optimizer step over the whole
rollout, split into `grad_accum` micro-batches to bound activation memory; DDP only
all-reduces on the last micro-batch (`no_sync` for the others).
"""
import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class PPOConfig:
    obs_dim: int = 10
    n_actions: int = 6
    hidden: int = 64
    iterations: int = 10
    rollout_per_rank: int = 6
    ppo_epochs: int = 2
    grad_accum: int = 4
    lr: float = 3e-3
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    seed: int = 7


class ActorCritic(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.Tanh(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh())
        self.pi = nn.Linear(cfg.hidden, cfg.n_actions)
        self.v = nn.Linear(cfg.hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class BanditEnv:
    """Reward = <W_a, obs> + noise for the chosen action a."""

    def __init__(self, cfg, rank):
        g = torch.Generator().manual_seed(cfg.seed)
        self.w = torch.randn(cfg.n_actions, cfg.obs_dim, generator=g) / cfg.obs_dim ** 0.5
        self.gen = torch.Generator().manual_seed(cfg.seed + 101 * (rank + 1))
        self.cfg = cfg

    def observe(self, n):
        return torch.randn(n, self.cfg.obs_dim, generator=self.gen)

    def reward(self, obs, act):
        r = (self.w[act] * obs).sum(-1)
        return r + 0.1 * torch.randn(r.shape, generator=self.gen)


class PPOTrainer:
    def __init__(self, cfg, rank, world_size):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        torch.manual_seed(cfg.seed)
        self.model = DDP(ActorCritic(cfg))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, eps=1e-5)
        self.env = BanditEnv(cfg, rank)
        self.sample_gen = torch.Generator().manual_seed(cfg.seed + 7 * rank)

    @torch.no_grad()
    def collect(self):
        obs = self.env.observe(self.cfg.rollout_per_rank)
        logits, values = self.model.module(obs)
        dist_ = torch.distributions.Categorical(logits=logits)
        probs = dist_.probs
        act = torch.multinomial(probs, 1, generator=self.sample_gen).squeeze(-1)
        logp = dist_.log_prob(act)
        rew = self.env.reward(obs, act)
        adv = rew - values
        return dict(obs=obs, act=act, logp=logp, ret=rew, adv=adv)

    def micro_loss(self, mb, n_total):
        logits, values = self.model(mb["obs"])
        d = torch.distributions.Categorical(logits=logits)
        logp = d.log_prob(mb["act"])
        ratio = torch.exp(logp - mb["logp"])
        s1 = ratio * mb["adv"]
        s2 = torch.clamp(ratio, 1 - self.cfg.clip_eps, 1 + self.cfg.clip_eps) * mb["adv"]
        pg = -torch.min(s1, s2)
        vf = (values - mb["ret"]) ** 2
        ent = d.entropy()
        per_sample = pg + self.cfg.vf_coef * vf - self.cfg.ent_coef * ent
        # sum over this micro-batch / rollout size: the K micro-batches add up to the rollout mean
        return per_sample.sum() / n_total

    def update(self, rollout):
        n = rollout["obs"].shape[0]
        keys = list(rollout.keys())
        chunks = list(zip(*[rollout[k].chunk(self.cfg.grad_accum) for k in keys]))
        for micro, parts in enumerate(chunks):
            mb = dict(zip(keys, parts))
            is_last = micro == len(chunks) - 1
            with (nullcontext() if is_last else self.model.no_sync()):
                loss = self.micro_loss(mb, n)
                loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        for it in range(self.cfg.iterations):
            rollout = self.collect()
            for _ in range(self.cfg.ppo_epochs):
                self.update(rollout)
            if self.rank == 0 and it % 3 == 0:
                print(f"iter {it}: mean reward {rollout['ret'].mean().item():.3f}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = PPOTrainer(PPOConfig(), rank, world)
    trainer.train()
    if rank == 0:
        net = trainer.model.module
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in net.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
