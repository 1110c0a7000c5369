"""PPO actor-critic trainer: two optimizers, each with its own GradScaler, DDP on two ranks
(torchrun). Actor and critic losses are backpropagated separately on every micro-batch.

The run is interrupted after a few updates (a window boundary), checkpointed to disk, and
resumed into freshly built objects (model, optimizers, scaler, schedulers, counters).
Advantages are whitened over the whole rollout of all ranks before it is cut into
micro-batches.
"""
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class PPOConfig:
    obs_dim: int = 10
    n_actions: int = 5
    hidden: int = 48
    rollout_per_rank: int = 96
    minibatch: int = 8
    accum: int = 3          # micro-batches per update
    ppo_epochs: int = 2
    stop_after_updates: int = 5   # simulated preemption
    actor_lr: float = 1e-3
    critic_lr: float = 3e-3
    vf_coef: float = 0.5
    clip_eps: float = 0.2
    max_grad_norm: float = 0.3
    seed: int = 99


class ActorCritic(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(c.obs_dim, c.hidden), nn.Tanh(), nn.Linear(c.hidden, c.n_actions))
        self.critic = nn.Sequential(nn.Linear(c.obs_dim, c.hidden), nn.Tanh(), nn.Linear(c.hidden, 1))

    def forward(self, obs):
        return self.actor(obs), self.critic(obs).squeeze(-1)


class PPOTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        self.net = ActorCritic(cfg)
        self.ddp = DDP(self.net)
        self.actor_opt = torch.optim.Adam(self.net.actor.parameters(), lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.net.critic.parameters(), lr=cfg.critic_lr, eps=1e-5)
        total = cfg.ppo_epochs * cfg.rollout_per_rank // (cfg.minibatch * cfg.accum)
        self.actor_sched = torch.optim.lr_scheduler.LinearLR(self.actor_opt, 1.0, 0.1, total_iters=total)
        self.actor_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        self.critic_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 6)
        self.updates = 0

    # ---- checkpointing -------------------------------------------------
    def state_dict(self):
        return {"net": self.net.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "sched": self.actor_sched.state_dict(),
                "actor_scaler": self.actor_scaler.state_dict(),
                "critic_scaler": self.critic_scaler.state_dict(), "updates": self.updates}

    def load_state_dict(self, sd):
        self.net.load_state_dict(sd["net"])
        self.actor_opt.load_state_dict(sd["actor_opt"])
        self.critic_opt.load_state_dict(sd["critic_opt"])
        self.actor_sched.load_state_dict(sd["sched"])
        self.actor_scaler.load_state_dict(sd["actor_scaler"])
        self.critic_scaler.load_state_dict(sd["critic_scaler"])
        self.updates = sd["updates"]

    # ---- training ------------------------------------------------------
    def micro_loss(self, mb):
        obs, act, old_lp, adv, ret = mb
        logits, value = self.ddp(obs)
        lp = torch.log_softmax(logits, -1).gather(-1, act[:, None]).squeeze(-1)
        ratio = torch.exp(lp - old_lp)
        pg = -torch.minimum(ratio * adv, ratio.clamp(1 - self.cfg.clip_eps, 1 + self.cfg.clip_eps) * adv).mean()
        vf = (value - ret).pow(2).mean()
        return pg, self.cfg.vf_coef * vf

    def update(self, window):
        K = len(window)
        for j, mb in enumerate(window):
            sync = j == K - 1
            self.ddp.require_backward_grad_sync = sync
            pg, vf = self.micro_loss(mb)
            self.actor_scaler.scale(pg / K).backward()
            self.critic_scaler.scale(vf / K).backward()
        pairs = ((self.actor_scaler, self.actor_opt, self.net.actor),
                 (self.critic_scaler, self.critic_opt, self.net.critic))
        for scaler, opt, mod in pairs:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(mod.parameters(), self.cfg.max_grad_norm)
            scaler.step(opt)
            scaler.update()
        self.actor_sched.step()
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        self.updates += 1

    def windows(self, rollout):
        c = self.cfg
        n = rollout[0].shape[0]
        out = []
        for epoch in range(c.ppo_epochs):
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(c.seed + 17 * epoch))
            mbs = [tuple(t[perm[i:i + c.minibatch]] for t in rollout) for i in range(0, n, c.minibatch)]
            out += [mbs[i:i + c.accum] for i in range(0, len(mbs), c.accum)]
        return out

    def train(self, rollout, stop_after=None):
        for w_idx, window in enumerate(self.windows(rollout)):
            if w_idx < self.updates:
                continue      # already done before the resume
            self.update(window)
            if stop_after is not None and self.updates == stop_after:
                return False
        return True


def collect_rollout(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 1000)
    N = cfg.rollout_per_rank * world
    obs = torch.randn(N, cfg.obs_dim, generator=g)
    act = torch.randint(0, cfg.n_actions, (N,), generator=g)
    old_lp = torch.log(torch.full((N,), 1.0 / cfg.n_actions)) + 0.1 * torch.randn(N, generator=g)
    ret = obs[:, :3].sum(-1) + 0.1 * torch.randn(N, generator=g)
    adv = ret - ret.mean()
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)     # whitened over the whole rollout
    sl = slice(rank * cfg.rollout_per_rank, (rank + 1) * cfg.rollout_per_rank)
    return obs[sl], act[sl], old_lp[sl], adv[sl], ret[sl]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    cfg = PPOConfig()
    rollout = collect_rollout(cfg, rank, world)

    ckdir = None
    if rank == 0:
        ckdir = tempfile.mkdtemp(prefix="ppo_ck_")
    box = [ckdir]
    dist.broadcast_object_list(box, src=0)
    ckpath = os.path.join(box[0], "trainer.pt")

    trainer = PPOTrainer(cfg, rank, world)
    trainer.train(rollout, stop_after=cfg.stop_after_updates)
    if rank == 0:
        torch.save(trainer.state_dict(), ckpath)
    dist.barrier()
    del trainer

    trainer = PPOTrainer(cfg, rank, world)          # fresh objects
    trainer.load_state_dict(torch.load(ckpath, weights_only=False))
    trainer.train(rollout)
    if rank == 0:
        print(f"updates {trainer.updates} scales {trainer.actor_scaler.get_scale()} {trainer.critic_scaler.get_scale()}", flush=True)
        h = hashlib.sha256()
        for _, p in trainer.net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
