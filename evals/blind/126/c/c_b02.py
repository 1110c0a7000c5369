"""Advantage actor-critic on a synthetic contextual bandit, Lightning Fabric DDP x 2.

Each update collects a rollout per rank and splits it into GRAD_ACCUM micro-batches;
DDP's all-reduce only runs on the last micro-batch (fabric.no_backward_sync).
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.torso(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class Bandit:
    """Reward depends on a hidden linear map of the context; deterministic given the seed."""

    def __init__(self, obs_dim, n_actions, seed):
        g = torch.Generator().manual_seed(99)
        self.w = torch.randn(obs_dim, n_actions, generator=g)
        self.gen = torch.Generator().manual_seed(seed)
        self.obs_dim = obs_dim

    def contexts(self, n):
        return torch.randn(n, self.obs_dim, generator=self.gen)

    def reward(self, obs, actions):
        scores = obs @ self.w
        return torch.tanh(scores.gather(1, actions[:, None]).squeeze(1))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=16)
    p.add_argument("--n-actions", type=int, default=5)
    p.add_argument("--rollout", type=int, default=32)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def a2c_loss(agent, obs, actions, returns, args):
    h = agent.torso(obs)
    logits, values = agent.pi(h), agent.v(h).squeeze(-1)
    logp = torch.log_softmax(logits, -1)
    logp_a = logp.gather(1, actions[:, None]).squeeze(1)
    adv = (returns - values).detach()
    pg = -(logp_a * adv).mean()
    vf = F.mse_loss(values, returns)
    ent = -(logp.exp() * logp).sum(-1).mean()
    return pg + args.vf_coef * vf - args.ent_coef * ent


def main():
    args = parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)

    agent = ActorCritic(args.obs_dim, args.n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr)
    agent, optimizer = fabric.setup(agent, optimizer)

    env = Bandit(args.obs_dim, args.n_actions, seed=args.seed + 1000 * fabric.global_rank)
    sampler = torch.Generator().manual_seed(args.seed + 31 * fabric.global_rank)

    for update in range(args.updates):
        with torch.no_grad():
            obs = env.contexts(args.rollout)
            logits, _ = agent(obs)
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=sampler).squeeze(1)
            returns = env.reward(obs, actions)

        optimizer.zero_grad()
        chunks = zip(obs.chunk(args.grad_accum), actions.chunk(args.grad_accum), returns.chunk(args.grad_accum))
        for micro, (o, a, r) in enumerate(chunks):
            accumulating = micro < args.grad_accum - 1
            with fabric.no_backward_sync(agent, enabled=accumulating):
                loss = a2c_loss(agent, o, a, r, args) / args.grad_accum
                fabric.backward(loss)
        optimizer.step()
        fabric.print(f"update {update} loss {loss.item() * args.grad_accum:.4f} mean_r {returns.mean().item():.3f}")

    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in agent.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
