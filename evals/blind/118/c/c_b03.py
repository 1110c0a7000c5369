"""REINFORCE on a synthetic contextual bandit with Lightning Fabric (2 CPU DDP ranks).

Each update collects fresh rollouts with the current policy, split into
`grad_accum` micro-batches; gradients are accumulated and synced once per update.
"""
import argparse
import hashlib
import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49221")

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=16)
    p.add_argument("--n-actions", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--entropy-coef", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=3)
    return p.parse_args()


class Policy(nn.Module):
    def __init__(self, obs_dim, hidden, n_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, obs):
        return self.head(self.body(obs))


class Bandit:
    """Reward is the cosine between the chosen action's prototype and the context."""

    def __init__(self, obs_dim, n_actions, rank, seed):
        g = torch.Generator().manual_seed(seed)
        self.protos = F.normalize(torch.randn(n_actions, obs_dim, generator=g), dim=-1)
        self.g = torch.Generator().manual_seed(seed * 100 + rank)
        self.obs_dim = obs_dim

    def contexts(self, n):
        return torch.randn(n, self.obs_dim, generator=self.g)

    def reward(self, obs, actions):
        return (F.normalize(obs, dim=-1) * self.protos[actions]).sum(-1)


class ReinforceTrainer:
    def __init__(self, args, fabric):
        self.args = args
        self.fabric = fabric
        torch.manual_seed(args.seed)
        policy = Policy(args.obs_dim, args.hidden, args.n_actions)
        optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
        self.policy, self.optimizer = fabric.setup(policy, optimizer)
        self.env = Bandit(args.obs_dim, args.n_actions, fabric.global_rank, args.seed)
        self.baseline = 0.0

    @torch.no_grad()
    def rollout(self):
        obs = self.env.contexts(self.args.micro_batch * self.args.grad_accum)
        probs = F.softmax(self.policy(obs), -1)
        actions = torch.multinomial(probs, 1, generator=self.env.g).squeeze(-1)
        rewards = self.env.reward(obs, actions)
        return obs, actions, rewards

    def micro_loss(self, obs, actions, rewards):
        logits = self.policy(obs)
        logp = F.log_softmax(logits, -1)
        chosen = logp.gather(1, actions[:, None]).squeeze(1)
        adv = rewards - self.baseline
        entropy = -(logp.exp() * logp).sum(-1)
        return -(chosen * adv).mean() - self.args.entropy_coef * entropy.mean()

    def update(self):
        K = self.args.grad_accum
        obs, actions, rewards = self.rollout()
        chunks = zip(obs.chunk(K), actions.chunk(K), rewards.chunk(K))
        for micro, (o, a, r) in enumerate(chunks):
            accumulating = micro < K - 1
            with self.fabric.no_backward_sync(self.policy, enabled=accumulating):
                loss = self.micro_loss(o, a, r) / K
                self.fabric.backward(loss)
            self.optimizer.step()
        self.optimizer.zero_grad()
        mean_r = self.fabric.all_reduce(rewards.mean(), reduce_op="mean")
        self.baseline = 0.9 * self.baseline + 0.1 * float(mean_r)

    def fit(self):
        for _ in range(self.args.updates):
            self.update()


def main():
    args = parse()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    trainer = ReinforceTrainer(args, fabric)
    trainer.fit()
    if fabric.global_rank == 0:
        module = trainer.policy.module if hasattr(trainer.policy, "module") else trainer.policy
        named = list(module.named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
    fabric.barrier()


if __name__ == "__main__":
    main()
