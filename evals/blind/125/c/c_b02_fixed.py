"""KL-regularised policy gradient (RLHF-style) on a contextual bandit, Lightning Fabric DDP.

The policy is pulled towards a frozen reference copy by a KL penalty whose coefficient
is tuned on-line by the adaptive controller of Ziegler et al. (2019), as in the PPO/RLHF
trainers. Each iteration samples a rollout per rank, then runs ACCUM micro-batches and
one optimizer step.
"""
import argparse
import copy
import hashlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--rollout", type=int, default=32, help="samples per rank per iteration")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per iteration")
    p.add_argument("--obs-dim", type=int, default=16)
    p.add_argument("--n-actions", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--init-kl-coef", type=float, default=0.3)
    p.add_argument("--target-kl", type=float, default=0.02)
    p.add_argument("--kl-horizon", type=int, default=128)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class AdaptiveKLController:
    """Adaptive KL coefficient, https://arxiv.org/abs/1909.08593 (section 2.2)."""

    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


class Policy(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.logits = nn.Linear(64, n_actions)

    def forward(self, obs):
        return self.logits(self.body(obs))


def reward_fn(obs, actions, n_actions):
    # a fixed, deterministic preference: the "right" action is a hash of the observation
    best = (obs[:, :n_actions].argmax(-1) + 1) % n_actions
    return (actions == best).float() - 0.1 * (actions == (best + 1) % n_actions).float()


@torch.no_grad()
def collect(policy, args, it, rank):
    g = torch.Generator().manual_seed(args.seed * 1000 + it * 10 + rank)
    obs = torch.randn(args.rollout, args.obs_dim, generator=g)
    probs = F.softmax(policy(obs), -1)
    actions = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    rewards = reward_fn(obs, actions, args.n_actions)
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    return obs, actions, adv


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)

    policy = Policy(args.obs_dim, args.n_actions)
    ref_policy = copy.deepcopy(policy).requires_grad_(False).eval()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    policy, optimizer = fabric.setup(policy, optimizer)
    kl_ctl = AdaptiveKLController(args.init_kl_coef, args.target_kl, args.kl_horizon)

    mb = args.rollout // args.accum
    for it in range(args.iters):
        obs, actions, adv = collect(policy, args, it, fabric.global_rank)
        window_kl = 0.0
        for j in range(args.accum):
            sl = slice(j * mb, (j + 1) * mb)
            with fabric.no_backward_sync(policy, enabled=j < args.accum - 1):
                logits = policy(obs[sl])
                logp_all = F.log_softmax(logits, -1)
                with torch.no_grad():
                    ref_logp_all = F.log_softmax(ref_policy(obs[sl]), -1)
                logp = logp_all.gather(-1, actions[sl, None]).squeeze(-1)
                pg_loss = -(adv[sl] * logp).mean()
                kl = (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1).mean()
                loss = (pg_loss + kl_ctl.value * kl) / args.accum
                fabric.backward(loss)
            window_kl += kl.detach() / args.accum
        optimizer.step()
        optimizer.zero_grad()
        mean_kl = fabric.all_reduce(window_kl, reduce_op="mean")
        kl_ctl.update(mean_kl.item(), n_steps=args.rollout * fabric.world_size)
        if fabric.global_rank == 0 and it % 4 == 0:
            print(f"iter {it} kl_coef {kl_ctl.value:.4f} kl {mean_kl.item():.4f}")

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {param_sha(policy)}")


if __name__ == "__main__":
    main()
