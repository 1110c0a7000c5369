"""REINFORCE on a synthetic continuous-control bandit with Lightning Fabric.

Gaussian policy: mean from an MLP, state-independent learned log-std.
Each rank collects its own rollouts; gradients are accumulated over
K micro-batches and synchronised on the last one.
"""
import argparse
import hashlib
import math

import torch
import torch.nn as nn
from lightning_fabric import Fabric


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=6)
    p.add_argument("--act-dim", type=int, default=3)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--baseline-decay", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden):
        super().__init__()
        self.mu = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, act_dim)
        )
        # state-independent exploration noise, learned
        self.log_std = nn.Parameter(torch.full((act_dim,), -0.5))

    def forward(self, obs):
        return self.mu(obs)

    def dist(self, obs):
        return torch.distributions.Normal(self(obs), self.log_std.exp())


class Bandit:
    """reward = -|| a - tanh(W s) ||^2, one step per episode."""

    def __init__(self, obs_dim, act_dim, seed, rank):
        g = torch.Generator().manual_seed(seed)
        self.W = torch.randn(act_dim, obs_dim, generator=g) / math.sqrt(obs_dim)
        self.gen = torch.Generator().manual_seed(seed * 1000 + 31 * rank + 1)
        self.obs_dim = obs_dim

    def reset(self, n):
        return torch.randn(n, self.obs_dim, generator=self.gen)

    def reward(self, obs, act):
        return -((act - torch.tanh(obs @ self.W.T)) ** 2).sum(-1)


def main():
    args = parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)
    torch.use_deterministic_algorithms(True)

    net = GaussianPolicy(args.obs_dim, args.act_dim, args.hidden)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    policy, opt = fabric.setup(net, opt)

    env = Bandit(args.obs_dim, args.act_dim, args.seed, fabric.global_rank)
    baseline = torch.tensor(0.0)
    K = args.grad_accum

    for update in range(args.updates):
        window_reward = torch.tensor(0.0)
        for k in range(K):
            obs = env.reset(args.micro_batch)
            with torch.no_grad():
                mean = net(obs)
                eps = torch.randn(mean.shape, generator=env.gen)
                act = mean + net.log_std.exp() * eps
                rew = env.reward(obs, act)
            is_accumulating = k < K - 1
            with fabric.no_backward_sync(policy, enabled=is_accumulating):
                mu = policy(obs)
                logp = torch.distributions.Normal(mu, net.log_std.exp()).log_prob(act).sum(-1)
                adv = rew - baseline
                loss = -(logp * adv).mean() / K
                fabric.backward(loss)
            window_reward += rew.sum()
        opt.step()
        opt.zero_grad()

        # baseline: running mean of the reward over all ranks (after the step)
        total = fabric.all_reduce(window_reward, reduce_op="sum")
        mean_r = total / (K * args.micro_batch * fabric.world_size)
        baseline = args.baseline_decay * baseline + (1 - args.baseline_decay) * mean_r
        if fabric.global_rank == 0 and update % 5 == 0:
            print(f"update {update}: mean reward {mean_r.item():.4f}")

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
