"""CleanRL-flavoured PPO update loop on 2 spawned ranks.

Rollouts are synthetic (fixed seeds). Every update each rank collects
`grad_accum * minibatch_size` transitions, splits them into `grad_accum`
minibatches and takes ONE optimizer step after averaging gradients over ranks.
The learning rate is linearly annealed to zero over the run, as in CleanRL.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributions import Categorical


@dataclass
class Args:
    seed: int = 1
    world_size: int = 2
    obs_dim: int = 10
    n_actions: int = 4
    total_samples: int = 1536
    minibatch_size: int = 16
    grad_accum: int = 2
    learning_rate: float = 5e-3
    anneal_lr: bool = True
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    port: int = 40203


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.actor = nn.Linear(64, n_actions)
        self.critic = nn.Linear(64, 1)

    def get_action_and_value(self, x, action=None):
        h = self.trunk(x)
        dist_ = Categorical(logits=self.actor(h))
        if action is None:
            action = dist_.sample()
        return action, dist_.log_prob(action), dist_.entropy(), self.critic(h).squeeze(-1)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def collect(agent, args, rank, update):
    g = torch.Generator().manual_seed(args.seed * 7919 + rank * 1000 + update)
    n = args.batch_size
    obs = torch.randn(n, args.obs_dim, generator=g)
    with torch.no_grad():
        logits = agent.actor(agent.trunk(obs))
        actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
        _, logp, _, values = agent.get_action_and_value(obs, actions)
    rewards = obs[:, 0] * (actions == 1).float() - obs[:, 1] * (actions == 2).float() + 0.1 * torch.randn(n, generator=g)
    advantages = rewards - values
    returns = rewards
    return obs, actions, logp, advantages, returns


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    args.batch_size = args.minibatch_size * args.grad_accum
    num_updates = args.total_samples // args.batch_size

    agent = Agent(args.obs_dim, args.n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    update = 1
    seen = 0
    while seen < args.total_samples:
        if args.anneal_lr:
            frac = 1.0 - (update - 1.0) / num_updates
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        obs, actions, old_logp, adv, ret = collect(agent, args, rank, update)
        optimizer.zero_grad()
        for start in range(0, args.batch_size, args.minibatch_size):
            mb = slice(start, start + args.minibatch_size)
            _, newlogp, entropy, newvalue = agent.get_action_and_value(obs[mb], actions[mb])
            ratio = (newlogp - old_logp[mb]).exp()
            pg_loss = torch.max(-adv[mb] * ratio, -adv[mb] * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = 0.5 * ((newvalue - ret[mb]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
            (loss / args.grad_accum).backward()
        for p in agent.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= args.world_size
        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()
        seen += args.batch_size * args.world_size
        update += 1

    if rank == 0:
        print(f"updates {update - 1} final lr {optimizer.param_groups[0]['lr']:.6f}")
        print("FINAL_SHA256", final_sha(agent))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = Args()
    mp.spawn(worker, args=(a,), nprocs=a.world_size, join=True)
