"""PPO (clipped surrogate + value loss + entropy) on 2 DDP ranks.
Synthetic contextual-bandit rollouts; each rank collects its own rollout,
then PPO epochs over minibatches, accumulating K minibatches per update."""
import contextlib, hashlib, os
from dataclasses import dataclass
import torch, torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class PPOConfig:
    obs_dim: int = 12
    n_actions: int = 5
    rollout_len: int = 128
    minibatch: int = 16
    grad_accum: int = 4
    ppo_epochs: int = 2
    iterations: int = 6
    lr: float = 1e-3
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01


class ActorCritic(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, c.n_actions)
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class PPOLearner:
    def __init__(self, cfg, rank):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(0)
        self.net = ActorCritic(cfg)
        self.model = DDP(self.net)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, eps=1e-5)
        self.env_w = torch.randn(cfg.obs_dim, cfg.n_actions, generator=torch.Generator().manual_seed(7))
        self.gen = torch.Generator().manual_seed(100 + rank)

    @torch.no_grad()
    def collect(self):
        c = self.cfg
        obs = torch.randn(c.rollout_len, c.obs_dim, generator=self.gen)
        logits, values = self.net(obs)
        dist_ = torch.distributions.Categorical(logits=logits)
        act = torch.multinomial(dist_.probs, 1, generator=self.gen).squeeze(-1)
        rew = (obs @ self.env_w).gather(1, act[:, None]).squeeze(-1) + 0.1 * torch.randn(c.rollout_len, generator=self.gen)
        adv = rew - values
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        return dict(obs=obs, act=act, logp=dist_.log_prob(act), ret=rew, adv=adv)

    def should_sync(self, i):
        # all-reduce once per update, on one micro-step of the window
        return (i + 1) % self.cfg.grad_accum == 0

    def loss(self, mb):
        c = self.cfg
        logits, v = self.model(mb["obs"])
        d = torch.distributions.Categorical(logits=logits)
        ratio = (d.log_prob(mb["act"]) - mb["logp"]).exp()
        s1, s2 = ratio * mb["adv"], ratio.clamp(1 - c.clip_eps, 1 + c.clip_eps) * mb["adv"]
        pg = -torch.min(s1, s2).mean()
        vf = (v - mb["ret"]).pow(2).mean()
        return pg + c.vf_coef * vf - c.ent_coef * d.entropy().mean()

    def update(self, batch):
        c = self.cfg
        n = c.rollout_len
        for ep in range(c.ppo_epochs):
            perm = torch.randperm(n, generator=self.gen)
            for i, start in enumerate(range(0, n, c.minibatch)):
                idx = perm[start:start + c.minibatch]
                mb = {k: v[idx] for k, v in batch.items()}
                ctx = contextlib.nullcontext() if self.should_sync(i) else self.model.no_sync()
                with ctx:
                    (self.loss(mb) / c.grad_accum).backward()
                if (i + 1) % c.grad_accum == 0:
                    self.opt.step()
                    self.opt.zero_grad(set_to_none=True)

    def train(self):
        for it in range(self.cfg.iterations):
            self.update(self.collect())
            if self.rank == 0:
                print(f"iter {it} done", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    learner = PPOLearner(PPOConfig(), rank)
    learner.train()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in learner.net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
