"""Offline DQN on a logged replay buffer with Lightning Fabric (2 DDP ranks).

Each optimizer step accumulates GRAD_ACCUM micro-batches of transitions per rank;
the target network tracks the online network with Polyak averaging.
"""
import copy
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class DQNConfig:
    obs_dim: int = 8
    n_actions: int = 4
    hidden: int = 64
    gamma: float = 0.97
    tau: float = 0.05
    lr: float = 1e-3
    micro_batch: int = 8
    grad_accum: int = 4
    updates: int = 20
    seed: int = 3


class QNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.ReLU(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU())
        self.q = nn.Linear(cfg.hidden, cfg.n_actions)

    def forward(self, obs):
        return self.q(self.body(obs))


class ReplayShard:
    """A fixed slice of logged transitions for one rank."""

    def __init__(self, cfg, rank, n=2048):
        g = torch.Generator().manual_seed(1000 + rank)
        self.obs = torch.randn(n, cfg.obs_dim, generator=g)
        self.act = torch.randint(0, cfg.n_actions, (n,), generator=g)
        self.rew = torch.tanh(self.obs[:, 0] * (self.act.float() - 1.5)) + 0.1 * torch.randn(n, generator=g)
        self.next_obs = 0.9 * self.obs + 0.3 * torch.randn(n, cfg.obs_dim, generator=g)
        self.done = (torch.rand(n, generator=g) < 0.1).float()
        self.g = torch.Generator().manual_seed(2000 + rank)

    def sample(self, bs):
        i = torch.randint(0, self.obs.shape[0], (bs,), generator=self.g)
        return self.obs[i], self.act[i], self.rew[i], self.next_obs[i], self.done[i]


@torch.no_grad()
def soft_update(target, online, tau):
    for t, o in zip(target.parameters(), online.parameters()):
        t.mul_(1.0 - tau).add_(o.detach(), alpha=tau)


def td_loss(q_net, target_net, batch, gamma):
    obs, act, rew, next_obs, done = batch
    q = q_net(obs).gather(1, act[:, None]).squeeze(1)
    with torch.no_grad():
        next_q = target_net(next_obs).max(dim=1).values
        target = rew + gamma * (1.0 - done) * next_q
    return F.smooth_l1_loss(q, target)


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(cfg=DQNConfig()):
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    online = QNet(cfg)
    target = copy.deepcopy(online).requires_grad_(False)
    optimizer = torch.optim.Adam(online.parameters(), lr=cfg.lr)
    online, optimizer = fabric.setup(online, optimizer)
    replay = ReplayShard(cfg, fabric.global_rank)

    for update in range(cfg.updates):
        for micro in range(cfg.grad_accum):
            is_accumulating = micro < cfg.grad_accum - 1
            batch = replay.sample(cfg.micro_batch)
            with fabric.no_backward_sync(online, enabled=is_accumulating):
                loss = td_loss(online, target, batch, cfg.gamma)
                fabric.backward(loss / cfg.grad_accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        soft_update(target, online, cfg.tau)

    if fabric.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in online.module.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(online.module), flush=True)


if __name__ == "__main__":
    main()
