"""PPO-style actor-critic on DDP (2 ranks) with episodes of varying length.

One optimizer step per rollout. A rollout (6 episodes per rank) is split into
3 micro-batches of 2 episodes each, so micro-batches hold different numbers of
timesteps. Every loss term is a sum over timesteps scaled by world / T_all where
T_all is the rollout's timestep count over all ranks (DDP then averages).
Actor + trunk use Adam, the value head uses SGD. The run is checkpointed after
update 6 and resumed into freshly built objects.
"""
import hashlib
import os
import shutil
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HP = SimpleNamespace(
    obs_dim=12, n_actions=4, hidden=48,
    episodes_per_rank=6, micro_batches=3,
    updates=12, resume_at=6,
    gamma=0.95, lam=0.9, clip_eps=0.2,
    vf_coef=0.5, ent_coef=0.01,
    actor_lr=3e-3, critic_lr=0.05, max_grad_norm=0.5,
    seed=2024,
)


class ActorCritic(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(hp.obs_dim, hp.hidden), nn.Tanh())
        self.pi = nn.Linear(hp.hidden, hp.n_actions)
        self.v = nn.Linear(hp.hidden, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class Env:
    def __init__(self, hp):
        g = torch.Generator().manual_seed(hp.seed)
        self.W = torch.randn(hp.n_actions, hp.obs_dim, generator=g)
        self.hp = hp

    def episode(self, gen):
        L = int(torch.randint(3, 11, (1,), generator=gen))
        obs = torch.randn(L, self.hp.obs_dim, generator=gen)
        return obs


class PPOTrainer:
    def __init__(self, hp, rank, world):
        self.hp, self.rank, self.world = hp, rank, world
        torch.manual_seed(hp.seed)
        self.net = ActorCritic(hp)
        self.model = DDP(self.net)
        actor_params = list(self.net.trunk.parameters()) + list(self.net.pi.parameters())
        self.actor_opt = torch.optim.Adam(actor_params, lr=hp.actor_lr)
        self.critic_opt = torch.optim.SGD(self.net.v.parameters(), lr=hp.critic_lr, momentum=0.9)
        self.env = Env(hp)
        self.update = 0

    # ---------------------------------------------------------------- rollout
    @torch.no_grad()
    def collect(self):
        gen = torch.Generator().manual_seed(hp_key(self.hp.seed, self.rank, self.update))
        episodes = []
        for _ in range(self.hp.episodes_per_rank):
            obs = self.env.episode(gen)
            logits, values = self.net(obs)
            act = torch.multinomial(F.softmax(logits, -1), 1, generator=gen).squeeze(-1)
            logp = F.log_softmax(logits, -1).gather(1, act[:, None]).squeeze(1)
            best = (obs @ self.env.W.t()).argmax(-1)
            rew = (act == best).float()
            adv = torch.zeros_like(rew)
            last = 0.0
            for t in reversed(range(len(rew))):
                nxt = values[t + 1] if t + 1 < len(rew) else 0.0
                delta = rew[t] + self.hp.gamma * nxt - values[t]
                last = delta + self.hp.gamma * self.hp.lam * last
                adv[t] = last
            episodes.append(dict(obs=obs, act=act, logp=logp, adv=adv, ret=adv + values))
        return episodes

    def whiten(self, episodes):
        a = torch.cat([e["adv"] for e in episodes])
        stats = torch.stack([a.sum(), (a * a).sum(), torch.tensor(float(a.numel()))])
        dist.all_reduce(stats)
        mean = stats[0] / stats[2]
        std = (stats[1] / stats[2] - mean ** 2).clamp_min(1e-8).sqrt()
        for e in episodes:
            e["adv"] = (e["adv"] - mean) / (std + 1e-8)
        return int(stats[2].item())

    # ---------------------------------------------------------------- update
    def micro_loss(self, chunk, scale):
        obs = torch.cat([e["obs"] for e in chunk])
        act = torch.cat([e["act"] for e in chunk])
        old_logp = torch.cat([e["logp"] for e in chunk])
        adv = torch.cat([e["adv"] for e in chunk])
        ret = torch.cat([e["ret"] for e in chunk])
        logits, values = self.model(obs)
        logp_all = F.log_softmax(logits, -1)
        logp = logp_all.gather(1, act[:, None]).squeeze(1)
        ratio = (logp - old_logp).exp()
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.hp.clip_eps, 1 + self.hp.clip_eps) * adv).sum()
        vf = F.mse_loss(values, ret, reduction="sum")
        ent = -(logp_all.exp() * logp_all).sum()
        return (pg + self.hp.vf_coef * vf - self.hp.ent_coef * ent) * scale

    def train_update(self):
        episodes = self.collect()
        t_all = self.whiten(episodes)
        scale = self.world / t_all
        per = self.hp.episodes_per_rank // self.hp.micro_batches
        chunks = [episodes[i:i + per] for i in range(0, len(episodes), per)]
        for i, chunk in enumerate(chunks):
            self.model.require_backward_grad_sync = i == len(chunks) - 1
            self.micro_loss(chunk, scale).backward()
        gn = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.hp.max_grad_norm)
        self.actor_opt.step()
        self.critic_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        self.update += 1
        return gn

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self):
        return {"model": self.net.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "update": self.update}

    def load_state_dict(self, sd):
        self.net.load_state_dict(sd["model"])
        self.actor_opt.load_state_dict(sd["actor_opt"])
        self.critic_opt.load_state_dict(sd["critic_opt"])
        self.update = sd["update"]


def hp_key(seed, rank, update):
    return seed * 10007 + rank * 101 + update


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    holder = [tempfile.mkdtemp(prefix="ppo_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt = os.path.join(holder[0], "state.pt")

    trainer = PPOTrainer(HP, rank, world)
    while trainer.update < HP.resume_at:
        gn = trainer.train_update()
        if rank == 0:
            print(f"update {trainer.update} grad_norm {gn:.3f}", flush=True)
    if rank == 0:
        torch.save(trainer.state_dict(), ckpt)
    dist.barrier()
    del trainer

    trainer = PPOTrainer(HP, rank, world)  # fresh objects, then resume
    trainer.load_state_dict(torch.load(ckpt, weights_only=False))
    while trainer.update < HP.updates:
        gn = trainer.train_update()
        if rank == 0:
            print(f"update {trainer.update} grad_norm {gn:.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in trainer.net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        print("FINAL_SHA256 " + h.hexdigest(), flush=True)
        shutil.rmtree(holder[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
