"""Advantage actor-critic on a synthetic episodic task, 2 ranks via mp.spawn + DDP.

Each rank collects a rollout of variable-length episodes, splits it into
`n_minibatches` micro-batches and accumulates one update over the rollout.
The loss is a per-valid-step mean over the rollout (padding steps masked out).
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACTS, HORIZON = 12, 5, 8
ENVS_PER_RANK = 16
N_MINIBATCHES = 4          # gradient accumulation steps per update
UPDATES = 15
GAMMA, VF_COEF, ENT_COEF = 0.95, 0.5, 0.01
PORT = 49205


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, ACTS)
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class SyntheticEpisodes:
    """Reward = 1 if the action matches argmax of a hidden projection of obs."""

    def __init__(self, rank, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.proj = torch.randn(OBS, ACTS, generator=g)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        # the two ranks run differently configured env pools: rank 1 ends episodes early
        self.min_len = 2 if rank == 1 else 5

    def observe(self, n):
        return torch.randn(n, HORIZON, OBS, generator=self.gen)

    def lengths(self, n):
        return torch.randint(self.min_len, HORIZON + 1, (n,), generator=self.gen)

    def reward(self, obs, act):
        return (act == (obs @ self.proj).argmax(-1)).float()


@torch.no_grad()
def collect(model, env):
    obs = env.observe(ENVS_PER_RANK)
    lens = env.lengths(ENVS_PER_RANK)
    mask = (torch.arange(HORIZON)[None, :] < lens[:, None]).float()
    logits, values = model(obs)
    act = torch.multinomial(torch.softmax(logits, -1).view(-1, ACTS), 1, generator=env.gen).view(obs.shape[:2])
    rew = env.reward(obs, act) * mask
    ret = torch.zeros_like(rew)
    running = torch.zeros(ENVS_PER_RANK)
    for t in reversed(range(HORIZON)):
        running = rew[:, t] + GAMMA * running * mask[:, t]
        ret[:, t] = running
    adv = (ret - values) * mask
    return dict(obs=obs, act=act, ret=ret, adv=adv, mask=mask)


def a2c_loss_sum(model, mb):
    logits, values = model(mb["obs"])
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, mb["act"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    m = mb["mask"]
    pg = -(logp * mb["adv"] * m).sum()
    vf = ((values - mb["ret"]) ** 2 * m).sum()
    ent = (entropy * m).sum()
    return pg + VF_COEF * vf - ENT_COEF * ent


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(ActorCritic())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    env = SyntheticEpisodes(rank)

    for update in range(UPDATES):
        roll = collect(model.module, env)
        n_valid = roll["mask"].sum()
        mb_size = ENVS_PER_RANK // N_MINIBATCHES
        opt.zero_grad(set_to_none=True)
        for k in range(N_MINIBATCHES):
            mb = {key: val[k * mb_size:(k + 1) * mb_size] for key, val in roll.items()}
            ctx = model.no_sync() if k < N_MINIBATCHES - 1 else contextlib.nullcontext()
            with ctx:
                loss = a2c_loss_sum(model, mb) / n_valid
                loss.backward()
        opt.step()
        if rank == 0 and update % 5 == 0:
            print(f"update {update} valid_steps {int(n_valid)} mean_ret {roll['ret'][:, 0].mean():.3f}")

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
