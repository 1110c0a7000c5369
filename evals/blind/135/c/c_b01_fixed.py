"""Offline REINFORCE (advantage-weighted log-likelihood) on logged rollouts, Lightning Fabric DDP.

Each window reads K rollout chunks ahead, counts the valid (non-padding) timesteps over all ranks,
and normalises the summed policy-gradient loss by that count.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from lightning_fabric import Fabric


@dataclass
class RLConfig:
    obs_dim: int = 12
    n_actions: int = 5
    hidden: int = 64
    chunk_len: int = 16        # timesteps per rollout chunk
    chunks_per_micro: int = 4  # rollout chunks per micro-batch
    accum: int = 4             # K
    updates: int = 12
    lr: float = 0.05
    momentum: float = 0.9
    gamma: float = 0.97
    seed: int = 1234


class Policy(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.Tanh(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh())
        self.pi = nn.Linear(cfg.hidden, cfg.n_actions)

    def forward(self, obs):
        return self.pi(self.body(obs))


def make_rollouts(cfg, rank, n_micro):
    """Logged rollouts with early termination (padding after done)."""
    g = torch.Generator().manual_seed(cfg.seed + 101 * rank)
    out = []
    for _ in range(n_micro):
        B, T = cfg.chunks_per_micro, cfg.chunk_len
        obs = torch.randn(B, T, cfg.obs_dim, generator=g)
        act = torch.randint(0, cfg.n_actions, (B, T), generator=g)
        rew = torch.randn(B, T, generator=g)
        lengths = torch.randint(3, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
        rew = rew * mask
        ret = torch.zeros_like(rew)
        running = torch.zeros(B)
        for t in reversed(range(T)):
            running = rew[:, t] + cfg.gamma * running
            ret[:, t] = running
        adv = (ret - ret.mean()) * mask
        out.append((obs, act, adv, mask))
    return out


def pg_loss_sum(policy, obs, act, adv, mask):
    logits = policy(obs)
    logp = torch.log_softmax(logits, -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
    return -(logp * adv * mask).sum()


def main():
    cfg = RLConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="32-true")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    torch.use_deterministic_algorithms(True)

    policy = Policy(cfg)
    opt = torch.optim.SGD(policy.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    policy, opt = fabric.setup(policy, opt)

    data = make_rollouts(cfg, fabric.global_rank, cfg.updates * cfg.accum)
    K = cfg.accum
    for u in range(cfg.updates):
        window = data[u * K:(u + 1) * K]
        n_valid = sum(m.sum() for (_, _, _, m) in window)
        # timesteps in this window on every rank
        n_valid = fabric.all_reduce(n_valid, reduce_op="sum")
        for j, (obs, act, adv, mask) in enumerate(window):
            last = j == K - 1
            with fabric.no_backward_sync(policy, enabled=not last):
                # DDP averages the gradients over the ranks: undo it for a global token mean
                loss = pg_loss_sum(policy, obs, act, adv, mask) * fabric.world_size / n_valid
                fabric.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if fabric.global_rank == 0 and u % 4 == 0:
            print(f"update {u} loss(last micro) {loss.item():.5f}")

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in policy.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
