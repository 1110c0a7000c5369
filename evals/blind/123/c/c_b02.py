"""PPO (clipped surrogate) on a toy contextual-bandit-like environment, two DDP ranks
spawned by the script itself. Each rank collects its own rollout; every PPO epoch splits
the rollout into minibatches of `micro_batch` rows and accumulates `grad_accum` of them
per optimizer step.

Run: python c_b02.py
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ARGS = SimpleNamespace(
    obs_dim=8, n_actions=4, hidden=32,
    rollout_len=48, micro_batch=8, grad_accum=3,
    ppo_epochs=2, num_updates=4, lr=0.05, momentum=0.9,
    clip_coef=0.2, vf_coef=0.5, max_grad_norm=5.0, seed=11,
    port=49203,
)


class ActorCritic(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(a.obs_dim, a.hidden), nn.Tanh())
        self.pi = nn.Linear(a.hidden, a.n_actions)
        self.v = nn.Linear(a.hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class ToyEnv:
    """Reward is 1 when the action matches argmax of a fixed projection of the observation."""

    def __init__(self, a, gen):
        self.a, self.gen = a, gen
        self.W = torch.randn(a.obs_dim, a.n_actions, generator=torch.Generator().manual_seed(123))

    def sample(self, n):
        return torch.randn(n, self.a.obs_dim, generator=self.gen)

    def reward(self, obs, act):
        best = (obs @ self.W).argmax(-1)
        return (act == best).float() + 0.1 * torch.randn(len(act), generator=self.gen)


@torch.no_grad()
def collect(model, env, a, gen):
    obs = env.sample(a.rollout_len)
    logits, values = model(obs)
    dist_ = torch.distributions.Categorical(logits=logits)
    act = torch.multinomial(dist_.probs, 1, generator=gen).squeeze(-1)
    rew = env.reward(obs, act)
    adv = rew - values
    return dict(obs=obs, act=act, logp=dist_.log_prob(act), ret=rew, adv=adv)


def ppo_loss(model, mb, a):
    logits, values = model(mb["obs"])
    d = torch.distributions.Categorical(logits=logits)
    ratio = (d.log_prob(mb["act"]) - mb["logp"]).exp()
    adv = mb["adv"]
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - a.clip_coef, 1 + a.clip_coef)).mean()
    vf = 0.5 * (values - mb["ret"]).pow(2).mean()
    return pg + a.vf_coef * vf


def worker(rank, world, a):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = DDP(ActorCritic(a))
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    gen = torch.Generator().manual_seed(a.seed * 100 + rank)
    env = ToyEnv(a, gen)

    n_mb = a.rollout_len // a.micro_batch  # 6 minibatches = 2 windows per PPO epoch
    for update in range(a.num_updates):
        batch = collect(model, env, a, gen)
        batch["adv"] = (batch["adv"] - batch["adv"].mean()) / (batch["adv"].std() + 1e-8)
        for epoch in range(a.ppo_epochs):
            perm = torch.randperm(a.rollout_len, generator=gen)
            optimizer.zero_grad(set_to_none=True)
            for i in range(n_mb):
                idx = perm[i * a.micro_batch:(i + 1) * a.micro_batch]
                mb = {k: v[idx] for k, v in batch.items()}
                sync = (i + 1) % a.grad_accum == 0
                if sync:
                    loss = ppo_loss(model, mb, a) / a.grad_accum
                    loss.backward()
                else:
                    with model.no_sync():
                        loss = ppo_loss(model, mb, a) / a.grad_accum
                        loss.backward()
                if sync:
                    nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
                    optimizer.step()
        if rank == 0:
            print(f"update {update}: mean reward {batch['ret'].mean():.3f}")

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.module.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, ARGS), nprocs=2, join=True)
