"""PPO (rsl_rl-style) on a continuous-control bandit, DDP over 2 ranks.

Each rank collects its own rollout; every mini-batch is split into K micro-batches whose
gradients are accumulated before one optimizer step. The learning rate follows rsl_rl's
"adaptive" KL schedule.
"""
import hashlib
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class PPOCfg:
    obs_dim: int = 10
    act_dim: int = 4
    num_envs: int = 32          # per rank
    num_steps: int = 8          # rollout length per env
    num_learning_epochs: int = 2
    num_mini_batches: int = 2
    grad_accum: int = 4         # micro-batches per mini-batch
    iterations: int = 3
    learning_rate: float = 5e-4
    schedule: str = "adaptive"
    desired_kl: float = 0.01
    clip_param: float = 0.2
    value_loss_coef: float = 1.0
    entropy_coef: float = 0.005
    max_grad_norm: float = 1.0
    seed: int = 3


class ActorCritic(nn.Module):
    def __init__(self, c: PPOCfg):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(c.obs_dim, 64), nn.ELU(), nn.Linear(64, 64), nn.ELU(), nn.Linear(64, c.act_dim))
        self.critic = nn.Sequential(nn.Linear(c.obs_dim, 64), nn.ELU(), nn.Linear(64, 1))
        self.log_std = nn.Parameter(torch.full((c.act_dim,), -0.5))

    def forward(self, obs):
        return self.actor(obs), self.log_std.expand(obs.shape[0], -1), self.critic(obs).squeeze(-1)


class PPO:
    def __init__(self, cfg: PPOCfg):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.policy = ActorCritic(cfg)
        self.ddp = DDP(self.policy)
        self.optimizer = torch.optim.Adam(self.ddp.parameters(), lr=cfg.learning_rate)
        self.learning_rate = cfg.learning_rate
        self.env_gen = torch.Generator().manual_seed(cfg.seed * 1000 + self.rank)
        self.target = torch.randn(cfg.obs_dim, cfg.act_dim, generator=torch.Generator().manual_seed(99))

    # ------------------------------------------------------------------ rollout
    @torch.no_grad()
    def collect(self):
        c = self.cfg
        n = c.num_envs * c.num_steps
        obs = torch.randn(n, c.obs_dim, generator=self.env_gen)
        mu, log_std, values = self.policy(obs)
        actions = mu + log_std.exp() * torch.randn(mu.shape, generator=self.env_gen)
        logp = torch.distributions.Normal(mu, log_std.exp()).log_prob(actions).sum(-1)
        rewards = -((actions - torch.tanh(obs @ self.target)) ** 2).sum(-1)
        returns = rewards
        adv = returns - values
        stats = torch.stack([adv.sum(), (adv ** 2).sum(), torch.tensor(float(n))])
        dist.all_reduce(stats)
        mean = stats[0] / stats[2]
        std = (stats[1] / stats[2] - mean ** 2).clamp_min(1e-8).sqrt()
        adv = (adv - mean) / (std + 1e-8)
        return dict(obs=obs, actions=actions, logp=logp, mu=mu, sigma=log_std.exp(), returns=returns, values=values, adv=adv)

    # ------------------------------------------------------------------ helpers
    def _kl(self, old_mu, old_sigma, mu, sigma):
        kl = torch.sum(
            torch.log(sigma / old_sigma + 1.0e-5)
            + (old_sigma.pow(2) + (old_mu - mu).pow(2)) / (2.0 * sigma.pow(2))
            - 0.5,
            dim=-1,
        ).mean()
        dist.all_reduce(kl)
        return kl / self.world

    def _adapt_lr(self, kl_mean):
        c = self.cfg
        if kl_mean > c.desired_kl * 2.0:
            self.learning_rate = max(1e-5, self.learning_rate / 1.5)
        elif kl_mean < c.desired_kl / 2.0:
            self.learning_rate = min(1e-2, self.learning_rate * 1.5)
        for g in self.optimizer.param_groups:
            g["lr"] = self.learning_rate

    def _micro_loss(self, mb):
        c = self.cfg
        mu, log_std, value = self.ddp(mb["obs"])
        sigma = log_std.exp()
        d = torch.distributions.Normal(mu, sigma)
        logp = d.log_prob(mb["actions"]).sum(-1)
        ratio = torch.exp(logp - mb["logp"])
        surr = -mb["adv"] * ratio
        surr_clipped = -mb["adv"] * ratio.clamp(1 - c.clip_param, 1 + c.clip_param)
        pg_loss = torch.max(surr, surr_clipped).mean()
        v_clipped = mb["values"] + (value - mb["values"]).clamp(-c.clip_param, c.clip_param)
        v_loss = torch.max((value - mb["returns"]).pow(2), (v_clipped - mb["returns"]).pow(2)).mean()
        ent = d.entropy().sum(-1).mean()
        return pg_loss + c.value_loss_coef * v_loss - c.entropy_coef * ent, mu.detach(), sigma.detach()

    # ------------------------------------------------------------------ update
    def update(self, buf, it):
        c = self.cfg
        n = buf["obs"].shape[0]
        mb_size = n // c.num_mini_batches
        micro = mb_size // c.grad_accum
        g = torch.Generator().manual_seed(c.seed + it)
        for epoch in range(c.num_learning_epochs):
            perm = torch.randperm(n, generator=g)
            for m in range(c.num_mini_batches):
                idx = perm[m * mb_size:(m + 1) * mb_size]
                self.optimizer.zero_grad(set_to_none=True)
                kl_window = 0.0
                for k in range(c.grad_accum):
                    sub = idx[k * micro:(k + 1) * micro]
                    mb = {key: v[sub] for key, v in buf.items()}
                    ctx = self.ddp.no_sync() if k < c.grad_accum - 1 else nullcontext()
                    with ctx:
                        loss, mu, sigma = self._micro_loss(mb)
                        if c.schedule == "adaptive" and c.desired_kl is not None:
                            with torch.inference_mode():
                                kl_window += self._kl(mb["mu"], mb["sigma"], mu, sigma) / c.grad_accum
                        (loss / c.grad_accum).backward()
                if c.schedule == "adaptive" and c.desired_kl is not None:
                    self._adapt_lr(kl_window)
                nn.utils.clip_grad_norm_(self.ddp.parameters(), c.max_grad_norm)
                self.optimizer.step()

    def learn(self):
        for it in range(self.cfg.iterations):
            buf = self.collect()
            self.update(buf, it)
            if self.rank == 0:
                print(f"it {it} mean return {buf['returns'].mean().item():.3f} lr {self.learning_rate:.2e}", flush=True)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    ppo = PPO(PPOCfg())
    ppo.learn()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in ppo.policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
