"""CleanRL-style PPO update on 2 DDP ranks (gloo), gradient accumulation over minibatches.

Each rank owns its own rollout buffer (synthetic, seeded per rank).  One optimizer step per
window of `grad_accum` minibatches; the per-minibatch PPO loss is a mean over equal-size
minibatches, so each micro-loss is divided by grad_accum and DDP averages over ranks.
"""
import argparse
import contextlib
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions.categorical import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--num-steps", type=int, default=96, help="rollout length per rank")
    p.add_argument("--obs-dim", type=int, default=8)
    p.add_argument("--num-actions", type=int, default=4)
    p.add_argument("--minibatch-size", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--update-epochs", type=int, default=3)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    return p.parse_args()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, n_act):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_act), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)

    def forward(self, x, action=None):
        return self.get_action_and_value(x, action)


def synthetic_rollout(args, rank, agent):
    g = torch.Generator().manual_seed(1000 + 17 * rank)
    obs = torch.randn(args.num_steps, args.obs_dim, generator=g)
    with torch.no_grad():
        logits = agent.actor(obs)
        actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
        logprobs = Categorical(logits=logits).log_prob(actions)
        values = agent.critic(obs).squeeze(-1)
    rewards = torch.randn(args.num_steps, generator=g) + obs[:, 0]
    returns = torch.zeros_like(rewards)
    running = torch.zeros(())
    for t in reversed(range(args.num_steps)):
        running = rewards[t] + 0.99 * running
        returns[t] = running
    advantages = returns - values
    return obs, actions, logprobs, values, returns, advantages


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    agent = DDP(Agent(args.obs_dim, args.num_actions))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    b_obs, b_actions, b_logprobs, b_values, b_returns, b_adv = synthetic_rollout(args, rank, agent.module)
    # normalise advantages over the whole rollout of all ranks
    stats = torch.stack([b_adv.sum(), (b_adv ** 2).sum(), torch.tensor(float(b_adv.numel()))])
    dist.all_reduce(stats)
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean ** 2).clamp_min(1e-12).sqrt()
    b_adv = (b_adv - mean) / (std + 1e-8)

    K = args.grad_accum
    n_mb = args.num_steps // args.minibatch_size
    assert n_mb % K == 0
    rng = np.random.default_rng(args.seed)
    updates = 0
    for epoch in range(args.update_epochs):
        b_inds = rng.permutation(args.num_steps)
        optimizer.zero_grad(set_to_none=True)
        for i in range(n_mb):
            mb_inds = torch.as_tensor(b_inds[i * args.minibatch_size:(i + 1) * args.minibatch_size])
            sync = (i + 1) % K == 0
            ctx = contextlib.nullcontext() if sync else agent.no_sync()
            with ctx:
                _, newlogprob, entropy, newvalue = agent(
                    b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                mb_adv = b_adv[mb_inds]
                pg_loss1 = -mb_adv * ratio
                pg_loss2 = -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                (loss / K).backward()
            if sync:
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                updates += 1

    h = hashlib.sha256()
    for _, p in agent.module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates {updates}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
