"""PPO on a synthetic contextual bandit with Lightning Fabric (2 CPU ranks, DDP).

CleanRL-style update phase adapted to gradient accumulation: each PPO minibatch is
split into `grad_accum` micro-batches, and the update phase stops early once the
(all-rank) approximate KL exceeds `target_kl`.
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--obs-dim", type=int, default=8)
    p.add_argument("--n-actions", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=64, help="rollout length per rank")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--update-epochs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--target-kl", type=float, default=0.02)
    return p.parse_args()


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden=32):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.actor(h), self.critic(h).squeeze(-1)


class BanditEnv:
    """Reward = score of the chosen action under a fixed random linear map, plus noise."""

    def __init__(self, obs_dim, n_actions, seed):
        g = torch.Generator().manual_seed(1234)
        self.w = torch.randn(obs_dim, n_actions, generator=g)
        self.g = torch.Generator().manual_seed(seed)

    def reset(self, n):
        return torch.randn(n, self.w.shape[0], generator=self.g)

    def reward(self, obs, actions):
        scores = obs @ self.w
        return scores.gather(1, actions[:, None]).squeeze(1) + 0.1 * torch.randn(len(obs), generator=self.g)


def collect(fabric, agent, env, n, gen):
    obs = env.reset(n)
    with torch.no_grad():
        logits, values = agent(obs)
        dist = torch.distributions.Categorical(logits=logits)
        probs = dist.probs
        actions = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        logprobs = dist.log_prob(actions)
    rewards = env.reward(obs, actions)
    return dict(obs=obs, actions=actions, logprobs=logprobs, values=values, returns=rewards, adv=rewards - values)


def ppo_loss(agent, mb, args):
    logits, newvalue = agent(mb["obs"])
    dist = torch.distributions.Categorical(logits=logits)
    newlogprob = dist.log_prob(mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
    pg1 = -mb["adv"] * ratio
    pg2 = -mb["adv"] * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg1, pg2).mean()
    v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    ent = dist.entropy().mean()
    return pg_loss - args.ent_coef * ent + args.vf_coef * v_loss, approx_kl


def main():
    args = parse_args()
    torch.use_deterministic_algorithms(True)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)

    agent = Agent(args.obs_dim, args.n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    agent, optimizer = fabric.setup(agent, optimizer)

    env = BanditEnv(args.obs_dim, args.n_actions, seed=100 + fabric.global_rank)
    gen = torch.Generator().manual_seed(200 + fabric.global_rank)
    perm_gen = torch.Generator().manual_seed(300 + fabric.global_rank)
    K = args.grad_accum
    n_micro = args.num_steps // args.micro_batch
    opt_steps = 0

    for iteration in range(args.iterations):
        rollout = collect(fabric, agent, env, args.num_steps, gen)
        stop = False
        for epoch in range(args.update_epochs):
            perm = torch.randperm(args.num_steps, generator=perm_gen)
            for m in range(n_micro):
                idx = perm[m * args.micro_batch:(m + 1) * args.micro_batch]
                mb = {k: v[idx] for k, v in rollout.items()}
                is_accumulating = (m + 1) % K != 0
                with fabric.no_backward_sync(agent, enabled=is_accumulating):
                    loss, approx_kl = ppo_loss(agent, mb, args)
                    fabric.backward(loss / K)
                if not is_accumulating:
                    optimizer.step()
                    optimizer.zero_grad()
                    opt_steps += 1
                approx_kl = fabric.all_reduce(approx_kl, reduce_op="mean")
                if args.target_kl is not None and approx_kl > args.target_kl:
                    fabric.print(f"iter {iteration} epoch {epoch} micro {m}: kl {approx_kl.item():.4f} > target, stop")
                    stop = True
                    break
            if stop:
                break

    fabric.print(f"optimizer steps: {opt_steps}")
    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in agent.module.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
