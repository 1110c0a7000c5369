"""Recurrent-free PPO with actor and critic as two FSDP2 models on 2 ranks.

Episodes have different lengths, so each micro-batch holds a different number of
valid time steps (padding masked out).  K = 3 micro-batches per window; both
losses are sums over valid steps divided by the window's all-ranks valid count,
times W (FSDP2 averages the reduce-scatter over ranks).  The actor owns AdamW and
is clipped (on DTensors) at 0.15; the critic owns SGD with momentum.  The actor's
observation encoder is frozen (its own FSDP unit).
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

cfg = SimpleNamespace(obs=12, act=4, hidden=32, T=9, episodes_per_mb=4, mbs=6, K=3,
                      iters=4, ppo_epochs=1, actor_lr=2e-3, critic_lr=5e-2, clip=0.15,
                      eps=0.2, seed=21)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(cfg.obs, cfg.hidden)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Encoder()
        self.trunk = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU())
        self.logits = nn.Linear(cfg.hidden, cfg.act)

    def forward(self, x):
        return self.logits(self.trunk(self.enc(x)))


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.v = nn.Sequential(nn.Linear(cfg.obs, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 1))

    def forward(self, x):
        return self.v(x).squeeze(-1)


def episodes(it, j, rank):
    g = torch.Generator().manual_seed(4099 * it + 13 * j + 1000 * rank)
    B = cfg.episodes_per_mb
    obs = torch.randn(B, cfg.T, cfg.obs, generator=g)
    lens = torch.randint(2, cfg.T + 1, (B,), generator=g)
    valid = (torch.arange(cfg.T)[None] < lens[:, None]).float()
    act = torch.randint(0, cfg.act, (B, cfg.T), generator=g)
    old_logp = torch.log(torch.full((B, cfg.T), 1.0 / cfg.act))
    rew = (act == (obs[..., 0] > 0).long()).float() * valid
    ret = torch.flip(torch.cumsum(torch.flip(rew, [1]), 1), [1])
    adv = ret - ret.sum() / valid.sum()
    return obs, act, old_logp, adv, ret, valid


def main():
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    actor, critic = Actor(), Critic()
    actor.enc.requires_grad_(False)
    fully_shard(actor.enc)
    fully_shard(actor)
    fully_shard(critic)
    a_opt = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=cfg.actor_lr)
    c_opt = torch.optim.SGD(critic.parameters(), lr=cfg.critic_lr, momentum=0.9)

    for it in range(cfg.iters):
        data = [episodes(it, j, rank) for j in range(cfg.mbs)]
        for ep in range(cfg.ppo_epochs):
            for w0 in range(0, cfg.mbs, cfg.K):
                win = data[w0:w0 + cfg.K]
                n = torch.stack([d[-1].sum() for d in win]).sum()
                dist.all_reduce(n)
                for k, (obs, act, old, adv, ret, valid) in enumerate(win):
                    sync = k == len(win) - 1
                    actor.set_requires_gradient_sync(sync)
                    critic.set_requires_gradient_sync(sync)
                    lp = F.log_softmax(actor(obs), -1).gather(-1, act[..., None]).squeeze(-1)
                    ratio = torch.exp(lp - old)
                    pg = -torch.min(ratio * adv, ratio.clamp(1 - cfg.eps, 1 + cfg.eps) * adv)
                    vf = 0.5 * (critic(obs) - ret) ** 2
                    ((pg * valid).sum() * W / n).backward()
                    ((vf * valid).sum() * W / n).backward()
                torch.nn.utils.clip_grad_norm_([p for p in actor.parameters() if p.requires_grad], cfg.clip)
                a_opt.step()
                c_opt.step()
                a_opt.zero_grad()
                c_opt.zero_grad()

    h, flat = hashlib.sha256(), []
    for m in (actor, critic):
        for _, p in m.named_parameters():
            t = p.full_tensor().detach().float().contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
