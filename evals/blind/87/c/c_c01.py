"""PPO (CleanRL flavour) on mp.spawn DDP ranks: shared trunk, actor and critic optimizers.

Each rank collects a rollout from a toy environment, then runs update epochs over
10 minibatches accumulated in windows of K = 4; the epoch's last window holds only
2 minibatches and is normalised by its own length.
"""
import contextlib
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = SimpleNamespace(world_size=2, port=39241, seed=11, obs_dim=6, n_actions=4, num_steps=80,
                      num_minibatches=10, accum=4, update_epochs=3, clip_coef=0.2, vf_coef=0.5,
                      ent_coef=0.01, actor_lr=3e-3, critic_lr=1e-2, max_grad_norm=0.3, gamma=0.97)


class ActorCritic(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(c.obs_dim, 32), nn.Tanh(), nn.Linear(32, c.n_actions))
        self.critic = nn.Sequential(nn.Linear(c.obs_dim, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs, actions):
        dist_ = torch.distributions.Categorical(logits=self.actor(obs))
        return dist_.log_prob(actions), dist_.entropy(), self.critic(obs).squeeze(-1)


@torch.no_grad()
def collect(model, c, gen):
    obs = torch.randn(c.num_steps, c.obs_dim, generator=gen)
    logits = model.actor(obs)
    actions = torch.multinomial(logits.softmax(-1), 1, generator=gen).squeeze(-1)
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
    rewards = (actions == (obs[:, 0] > 0).long() * 2).float() + 0.1 * obs[:, 1]
    values = model.critic(obs).squeeze(-1)
    returns = torch.zeros_like(rewards)
    running = 0.0
    for t in reversed(range(c.num_steps)):
        running = rewards[t] + c.gamma * running
        returns[t] = running
    adv = returns - values
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    return obs, actions, logp, adv, returns


def ppo_loss(ddp_model, mb, c):
    obs, actions, old_logp, adv, ret = mb
    new_logp, ent, v = ddp_model(obs, actions)
    ratio = (new_logp - old_logp).exp()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean()
    v_loss = 0.5 * ((v - ret) ** 2).mean()
    return pg - c.ent_coef * ent.mean() + c.vf_coef * v_loss


def worker(rank, c):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(c.port)
    dist.init_process_group("gloo", rank=rank, world_size=c.world_size)
    torch.set_num_threads(1)
    torch.manual_seed(c.seed)
    net = ActorCritic(c)
    model = DDP(net)
    actor_opt = torch.optim.Adam(net.actor.parameters(), lr=c.actor_lr, eps=1e-5)
    critic_opt = torch.optim.Adam(net.critic.parameters(), lr=c.critic_lr, eps=1e-5)
    gen = torch.Generator().manual_seed(c.seed + 100 * rank)

    n_updates = 0
    for iteration in range(2):
        buf = collect(net, c, gen)
        mb_size = c.num_steps // c.num_minibatches
        for epoch in range(c.update_epochs):
            perm = torch.randperm(c.num_steps, generator=gen)
            mbs = [perm[i * mb_size:(i + 1) * mb_size] for i in range(c.num_minibatches)]
            windows = [mbs[i:i + c.accum] for i in range(0, len(mbs), c.accum)]
            for window in windows:
                for j, idx in enumerate(window):
                    last = j == len(window) - 1
                    ctx = contextlib.nullcontext() if last else model.no_sync()
                    with ctx:
                        loss = ppo_loss(model, [t[idx] for t in buf], c) / len(window)
                        loss.backward()
                nn.utils.clip_grad_norm_(net.actor.parameters(), c.max_grad_norm)
                actor_opt.step()
                critic_opt.step()
                actor_opt.zero_grad(set_to_none=True)
                critic_opt.zero_grad(set_to_none=True)
                n_updates += 1
        if rank == 0:
            print(f"iteration {iteration} updates {n_updates} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(CFG,), nprocs=CFG.world_size)
