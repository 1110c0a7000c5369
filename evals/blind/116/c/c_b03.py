"""REINFORCE with a running-mean baseline on a synthetic contextual task, Lightning
Fabric DDP on 2 ranks. Each optimizer step uses a window of K rollouts per rank;
the policy-gradient loss is normalised over the timesteps of the whole window
(all ranks), so the update is the mean over every timestep collected for it.

Launch: torchrun --nproc-per-node 2 c_b03.py
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from lightning_fabric import Fabric


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=8)
    p.add_argument("--n-actions", type=int, default=4)
    p.add_argument("--episodes-per-rollout", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--updates", type=int, default=15)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=3)
    return p.parse_args()


class Policy(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.logits = nn.Linear(32, n_actions)

    def forward(self, obs):
        return torch.log_softmax(self.logits(self.body(obs)), dim=-1)


class ToyEnv:
    """Episodes of 3..8 steps; reward 1 when the action matches a hidden linear rule."""

    def __init__(self, obs_dim, n_actions, seed):
        g = torch.Generator().manual_seed(1000)
        self.rule = torch.randn(obs_dim, n_actions, generator=g)
        self.gen = torch.Generator().manual_seed(seed)
        self.obs_dim = obs_dim

    def rollout(self, policy, n_episodes, gamma):
        obs_l, act_l, ret_l = [], [], []
        for _ in range(n_episodes):
            length = int(torch.randint(3, 9, (1,), generator=self.gen))
            obs = torch.randn(length, self.obs_dim, generator=self.gen)
            with torch.no_grad():
                probs = policy(obs).exp()
            act = torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)
            rew = (act == (obs @ self.rule).argmax(-1)).float()
            ret = torch.zeros(length)
            running = 0.0
            for t in reversed(range(length)):
                running = rew[t] + gamma * running
                ret[t] = running
            obs_l.append(obs), act_l.append(act), ret_l.append(ret)
        return torch.cat(obs_l), torch.cat(act_l), torch.cat(ret_l)


def allreduce_grads(module):
    """Sum gradients over ranks (the loss is already normalised by the global timestep count)."""
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def main():
    args = parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)
    K, W = args.grad_accum, fabric.world_size

    policy = Policy(args.obs_dim, args.n_actions)
    optimizer = torch.optim.SGD(policy.parameters(), lr=args.lr, momentum=0.9)
    policy, optimizer = fabric.setup(policy, optimizer)
    env = ToyEnv(args.obs_dim, args.n_actions, seed=args.seed * 100 + fabric.global_rank)
    baseline = 0.0

    for update in range(args.updates):
        # collect the window first: K rollouts on this rank
        window = [env.rollout(policy, args.episodes_per_rollout, args.gamma) for _ in range(K)]
        n_local = torch.tensor(float(sum(r[0].size(0) for r in window)))
        n_global = fabric.all_reduce(n_local, reduce_op="sum")
        mean_ret = fabric.all_reduce(sum(r[2].sum() for r in window), reduce_op="sum") / n_global

        optimizer.zero_grad()
        for k, (obs, act, ret) in enumerate(window):
            with fabric.no_backward_sync(policy, enabled=k < K - 1):
                logp = policy(obs).gather(-1, act[:, None]).squeeze(-1)
                # DDP averages over ranks, hence x W to get the sum over the window's timesteps
                loss = -(logp * (ret - baseline)).sum() * W / n_global
                fabric.backward(loss)
        allreduce_grads(policy)
        optimizer.step()
        baseline = 0.9 * baseline + 0.1 * float(mean_ret)

    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in policy.module.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
