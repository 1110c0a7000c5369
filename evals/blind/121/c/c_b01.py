"""Advantage actor-critic on a synthetic contextual bandit, Lightning Fabric on 2 CPU ranks.

Each optimizer step consumes one rollout window: K micro-batches of B contexts per rank.
The policy and the value baseline share one Adam optimizer.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class A2CConfig:
    obs_dim: int = 12
    n_actions: int = 5
    hidden: int = 32
    micro_batch: int = 8
    grad_accum: int = 4
    updates: int = 20
    lr: float = 3e-3
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    seed: int = 1234


class Agent(nn.Module):
    def __init__(self, cfg: A2CConfig):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.Tanh(),
                                    nn.Linear(cfg.hidden, cfg.n_actions))
        self.value = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.Tanh(),
                                   nn.Linear(cfg.hidden, 1))


class BanditEnv:
    """Reward is a fixed (seeded) linear score of the context for the chosen arm, plus noise."""

    def __init__(self, cfg: A2CConfig, rank: int):
        g = torch.Generator().manual_seed(cfg.seed)
        self.w = torch.randn(cfg.obs_dim, cfg.n_actions, generator=g)
        self.gen = torch.Generator().manual_seed(cfg.seed + 100 + rank)
        self.cfg = cfg

    def contexts(self):
        return torch.randn(self.cfg.micro_batch, self.cfg.obs_dim, generator=self.gen)

    def reward(self, obs, actions):
        score = (obs @ self.w).gather(1, actions[:, None]).squeeze(1)
        return score + 0.1 * torch.randn(score.shape, generator=self.gen)


def a2c_loss(policy, value, obs, env, sample_gen, cfg):
    logits = policy(obs)
    dist = torch.distributions.Categorical(logits=logits)
    with torch.no_grad():
        probs = F.softmax(logits, -1)
        actions = torch.multinomial(probs, 1, generator=sample_gen).squeeze(1)
    rewards = env.reward(obs, actions)
    v = value(obs).squeeze(-1)
    adv = (rewards - v).detach()
    pg = -(dist.log_prob(actions) * adv).mean()
    vf = F.mse_loss(v, rewards)
    ent = dist.entropy().mean()
    return pg + cfg.value_coef * vf - cfg.entropy_coef * ent


def main():
    cfg = A2CConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    agent = Agent(cfg)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr)

    policy = fabric.setup_module(agent.policy)
    value = agent.value.to(fabric.device)
    optimizer = fabric.setup_optimizers(optimizer)

    env = BanditEnv(cfg, fabric.global_rank)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 7 + fabric.global_rank)

    for update in range(cfg.updates):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(cfg.grad_accum):
            obs = env.contexts()
            loss = a2c_loss(policy, value, obs, env, sample_gen, cfg)
            fabric.backward(loss / cfg.grad_accum)
        optimizer.step()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in agent.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
