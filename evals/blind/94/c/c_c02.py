"""PPO (clipped objective) with separate actor and critic on a synthetic one-step task.

Two ranks spawned here, no DDP: each window's gradients are summed across ranks by hand,
every loss term being a sum over the window's samples divided by the all-ranks sample
count of that window. The actor's observation normaliser is a frozen parameter.
Actor: Adam; critic: SGD with momentum; an EMA of the actor is kept for evaluation.
Rollouts of 40 samples per rank in micro-batches of 8 with K = 3: windows of 3 and 2.
"""
import copy
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class PPOConfig:
    world_size = 2
    port = 47208
    obs_dim = 10
    n_actions = 5
    rollout_per_rank = 40
    micro_batch = 8
    grad_accum = 3
    iterations = 3
    ppo_epochs = 2
    clip_eps = 0.2
    ent_coef = 0.01
    vf_coef = 0.5
    actor_lr = 3e-3
    critic_lr = 5e-2
    max_grad_norm = 0.5
    ema_decay = 0.9


class Actor(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.obs_scale = nn.Parameter(torch.linspace(0.5, 1.5, c.obs_dim), requires_grad=False)
        self.net = nn.Sequential(nn.Linear(c.obs_dim, 64), nn.Tanh(), nn.Linear(64, c.n_actions))

    def forward(self, obs):
        return self.net(obs * self.obs_scale)


class Critic(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(c.obs_dim, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


def allreduce_sum_(tensors):
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)


class PPOLearner:
    def __init__(self, c, rank):
        self.c, self.rank = c, rank
        torch.manual_seed(42)
        self.agent = nn.ModuleDict({"actor": Actor(c), "critic": Critic(c)})
        self.ema_actor = copy.deepcopy(self.agent["actor"]).requires_grad_(False)
        self.actor_params = [p for p in self.agent["actor"].parameters() if p.requires_grad]
        self.critic_params = list(self.agent["critic"].parameters())
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=c.actor_lr)
        self.critic_opt = torch.optim.SGD(self.critic_params, lr=c.critic_lr, momentum=0.9)
        self.w_env = torch.randn(c.obs_dim, c.n_actions, generator=torch.Generator().manual_seed(5))

    @torch.no_grad()
    def collect(self, it):
        c = self.c
        g = torch.Generator().manual_seed(1000 * it + self.rank)
        obs = torch.randn(c.rollout_per_rank, c.obs_dim, generator=g)
        logits = self.agent["actor"](obs)
        act = torch.multinomial(F.softmax(logits, -1), 1, generator=g).squeeze(-1)
        old_logp = F.log_softmax(logits, -1).gather(1, act[:, None]).squeeze(-1)
        rew = (obs @ self.w_env).gather(1, act[:, None]).squeeze(-1) + 0.1 * torch.randn(act.shape, generator=g)
        values = self.agent["critic"](obs)
        adv = rew - values
        # normalise advantages over the whole rollout of all ranks
        stats = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(adv.numel()))])
        dist.all_reduce(stats)
        mean = stats[0] / stats[2]
        std = (stats[1] / stats[2] - mean * mean).clamp_min(1e-8).sqrt()
        return dict(obs=obs, act=act, old_logp=old_logp, ret=rew, adv=(adv - mean) / std)

    def micro_losses(self, mb):
        c = self.c
        logits = self.agent["actor"](mb["obs"])
        logp_all = F.log_softmax(logits, -1)
        logp = logp_all.gather(1, mb["act"][:, None]).squeeze(-1)
        ratio = torch.exp(logp - mb["old_logp"])
        pg = -torch.min(ratio * mb["adv"], ratio.clamp(1 - c.clip_eps, 1 + c.clip_eps) * mb["adv"])
        ent = -(logp_all.exp() * logp_all).sum(-1)
        actor_sum = (pg - c.ent_coef * ent).sum()
        critic_sum = c.vf_coef * (self.agent["critic"](mb["obs"]) - mb["ret"]).pow(2).sum()
        return actor_sum, critic_sum

    def update_window(self, micro_batches):
        n = torch.tensor(float(sum(mb["obs"].shape[0] for mb in micro_batches)))
        dist.all_reduce(n)
        for mb in micro_batches:
            a, v = self.micro_losses(mb)
            ((a + v) / n).backward()
        allreduce_sum_([p.grad for p in self.actor_params + self.critic_params])
        torch.nn.utils.clip_grad_norm_(self.actor_params, self.c.max_grad_norm)
        self.actor_opt.step()
        self.critic_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, p in zip(self.ema_actor.parameters(), self.agent["actor"].parameters()):
                pe.mul_(self.c.ema_decay).add_(p, alpha=1 - self.c.ema_decay)

    def learn(self):
        c = self.c
        for it in range(c.iterations):
            roll = self.collect(it)
            for ep in range(c.ppo_epochs):
                perm = torch.randperm(c.rollout_per_rank, generator=torch.Generator().manual_seed(77 * it + ep + 13 * self.rank))
                mbs = [{k: v[perm[i:i + c.micro_batch]] for k, v in roll.items()}
                       for i in range(0, c.rollout_per_rank, c.micro_batch)]
                for w in range(0, len(mbs), c.grad_accum):
                    self.update_window(mbs[w:w + c.grad_accum])


def entry(rank, c):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(c.port)
    dist.init_process_group("gloo", rank=rank, world_size=c.world_size)
    torch.use_deterministic_algorithms(True)
    learner = PPOLearner(c, rank)
    learner.learn()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in learner.agent.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = PPOConfig()
    mp.spawn(entry, args=(cfg,), nprocs=cfg.world_size, join=True)
