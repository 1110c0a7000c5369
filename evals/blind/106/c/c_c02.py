"""Step-level PPO on 2 DDP ranks with variable-length episodes.

Each micro-batch is one padded episode; a window is `accum` episodes (3-3-2 per
update epoch, the short tail is its own window).  Every loss term is a sum over
valid steps divided by the window's all-ranks valid-step count, times the world
size because DDP averages.  The run is checkpointed after iteration 2 and
resumed into freshly built objects.
"""
import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class PPOConfig:
    obs_dim: int = 6
    n_actions: int = 5
    hidden: int = 32
    episodes_per_rank: int = 8
    max_len: int = 16
    accum: int = 3
    iterations: int = 4
    resume_after: int = 2
    gamma: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    lr: float = 3e-3
    max_grad_norm: float = 1.0
    seed: int = 17


class Agent(nn.Module):
    def __init__(self, c: PPOConfig):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.obs_dim, c.hidden), nn.Tanh())
        self.pi = nn.Linear(c.hidden, c.n_actions)
        self.v = nn.Linear(c.hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class Collector:
    def __init__(self, c, rank):
        self.c, self.rank = c, rank
        self.w = torch.randn(c.obs_dim, c.n_actions, generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def __call__(self, agent, it):
        c = self.c
        g = torch.Generator().manual_seed(10_000 + 97 * it + self.rank)
        E, T = c.episodes_per_rank, c.max_len
        obs = torch.randn(E, T, c.obs_dim, generator=g)
        lengths = torch.randint(3, T + 1, (E,), generator=g)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
        logits, values = agent(obs)
        actions = torch.multinomial(F.softmax(logits, -1).view(-1, c.n_actions), 1, generator=g).view(E, T)
        logp = F.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
        rewards = (obs @ self.w).gather(-1, actions[..., None]).squeeze(-1) * mask
        returns = torch.zeros(E, T)
        run = torch.zeros(E)
        for t in reversed(range(T)):
            run = rewards[:, t] + c.gamma * run * mask[:, t]
            returns[:, t] = run
        adv = (returns - values) * mask
        s = torch.stack([adv.sum(), (adv * adv).sum(), mask.sum()])
        dist.all_reduce(s)
        mean = s[0] / s[2]
        std = (s[1] / s[2] - mean ** 2).clamp_min(1e-8).sqrt()
        adv = (adv - mean) / std * mask
        return [dict(obs=obs[e], actions=actions[e], logp=logp[e], adv=adv[e], returns=returns[e],
                     mask=mask[e]) for e in range(E)]


class Learner:
    def __init__(self, c: PPOConfig, rank, world):
        self.c, self.rank, self.world = c, rank, world
        torch.manual_seed(c.seed)
        self.agent = Agent(c)
        self.ddp = DDP(self.agent)
        self.opt = torch.optim.Adam(self.agent.parameters(), lr=c.lr, eps=1e-5)
        self.collector = Collector(c, rank)
        self.iteration = 0

    def windows(self, episodes):
        k = self.c.accum
        return [episodes[i:i + k] for i in range(0, len(episodes), k)]

    def window_count(self, window):
        n = torch.stack([mb["mask"].sum() for mb in window]).sum()
        dist.all_reduce(n)
        return n

    def micro_loss(self, mb, denom):
        logits, v = self.ddp(mb["obs"])
        logp_all = F.log_softmax(logits, -1)
        logp = logp_all.gather(-1, mb["actions"][:, None]).squeeze(-1)
        ratio = (logp - mb["logp"]).exp()
        pg = torch.max(-mb["adv"] * ratio, -mb["adv"] * ratio.clamp(1 - self.c.clip, 1 + self.c.clip))
        vl = 0.5 * (v - mb["returns"]) ** 2
        ent = -(logp_all.exp() * logp_all).sum(-1)
        per_step = pg + self.c.vf_coef * vl - self.c.ent_coef * ent
        return (per_step * mb["mask"]).sum() * self.world / denom

    def run_iteration(self):
        episodes = self.collector(self.agent, self.iteration)
        for window in self.windows(episodes):
            denom = self.window_count(window)
            for j, mb in enumerate(window):
                last = j == len(window) - 1
                ctx = contextlib.nullcontext() if last else self.ddp.no_sync()
                with ctx:
                    self.micro_loss(mb, denom).backward()
            nn.utils.clip_grad_norm_(self.agent.parameters(), self.c.max_grad_norm)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.iteration += 1

    def state_dict(self):
        return {"agent": self.agent.state_dict(), "opt": self.opt.state_dict(), "iteration": self.iteration}

    def load_state_dict(self, sd):
        self.agent.load_state_dict(sd["agent"])
        self.opt.load_state_dict(sd["opt"])
        self.iteration = sd["iteration"]


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PPOConfig()
    path = os.path.join(tempfile.gettempdir(), f"c_c02_{os.environ['MASTER_PORT']}.pt")

    learner = Learner(cfg, rank, world)
    while learner.iteration < cfg.resume_after:
        learner.run_iteration()
    if rank == 0:
        torch.save(learner.state_dict(), path)
    dist.barrier()
    del learner

    learner = Learner(cfg, rank, world)  # new objects, then restore
    learner.load_state_dict(torch.load(path))
    while learner.iteration < cfg.iterations:
        learner.run_iteration()
    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(learner.agent)}")
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
