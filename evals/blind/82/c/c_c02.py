"""PPO actor-critic with fp16 autocast and a GradScaler, two optimizers, on 2 DDP ranks.

Each rank collects its own rollouts from a toy "reach the target" environment whose
episodes end early, so the ranks hold different numbers of samples. Every PPO epoch is one
accumulation window: the rank's buffer is cut into K uneven micro-batches and the summed
per-sample losses are normalised by the all-ranks sample count (x world size, since DDP
averages). Actor and critic have separate optimizers and separate clip norms; one
GradScaler serves both. Launch with torchrun on 2 processes.
"""
import hashlib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class PPOArgs:
    seed: int = 99
    n_envs: int = 8
    max_len: int = 20
    iterations: int = 6
    ppo_epochs: int = 4
    n_micro: int = 3                 # gradient accumulation steps per window
    gamma: float = 0.97
    gae_lambda: float = 0.9
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    actor_lr: float = 3e-3
    critic_lr: float = 1e-2
    actor_clip: float = 0.5
    critic_clip: float = 1.0


class ReachEnv:
    """1-D point mass; actions -1/0/+1 push it; episode ends near the target."""

    def __init__(self, n, gen):
        self.n, self.gen = n, gen

    def reset(self):
        self.pos = torch.rand(self.n, generator=self.gen) * 4 - 2
        self.vel = torch.zeros(self.n)
        self.tgt = torch.rand(self.n, generator=self.gen) * 4 - 2
        self.done = torch.zeros(self.n, dtype=torch.bool)
        return self.obs()

    def obs(self):
        return torch.stack([self.pos, self.vel, self.tgt, self.tgt - self.pos], 1)

    def step(self, action):
        self.vel = 0.8 * self.vel + 0.1 * (action.float() - 1)
        self.pos = self.pos + self.vel
        dist_ = (self.tgt - self.pos).abs()
        reward = -dist_ + 2.0 * (dist_ < 0.15).float()
        self.done = self.done | (dist_ < 0.15)
        return self.obs(), reward, self.done.clone()


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 3))
        self.critic = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, obs):
        return self.actor(obs), self.critic(obs).squeeze(-1)


@torch.no_grad()
def collect(net, env, args, gen):
    obs_l, act_l, logp_l, val_l, rew_l, alive_l = [], [], [], [], [], []
    obs = env.reset()
    alive = torch.ones(env.n, dtype=torch.bool)
    for _ in range(args.max_len):
        logits, value = net(obs)
        dist_ = torch.distributions.Categorical(logits=logits)
        a = torch.multinomial(dist_.probs, 1, generator=gen).squeeze(1)
        nobs, r, done = env.step(a)
        obs_l.append(obs); act_l.append(a); logp_l.append(dist_.log_prob(a))
        val_l.append(value); rew_l.append(r); alive_l.append(alive.clone())
        alive = alive & ~done
        obs = nobs
    # GAE over the time axis, episodes stop at their first "done"
    T = len(rew_l)
    vals = torch.stack(val_l)
    rews = torch.stack(rew_l)
    alive_m = torch.stack(alive_l)
    nxt_alive = torch.cat([alive_m[1:], torch.zeros(1, env.n, dtype=torch.bool)])
    adv = torch.zeros(T, env.n)
    last = torch.zeros(env.n)
    for t in reversed(range(T)):
        nv = vals[t + 1] if t + 1 < T else torch.zeros(env.n)
        delta = rews[t] + args.gamma * nv * nxt_alive[t] - vals[t]
        last = delta + args.gamma * args.gae_lambda * nxt_alive[t] * last
        adv[t] = last
    ret = adv + vals
    keep = alive_m.reshape(-1)
    cat = lambda xs: torch.stack(xs).reshape(-1, *xs[0].shape[1:])[keep]
    return dict(obs=cat(obs_l), act=cat(act_l), logp=cat(logp_l),
                adv=adv.reshape(-1)[keep], ret=ret.reshape(-1)[keep])


def global_sum(x):
    t = torch.as_tensor(x, dtype=torch.float64).clone()
    dist.all_reduce(t)
    return t


def ppo_loss_sum(model, mb, args):
    with torch.autocast("cpu", dtype=torch.float16):
        logits, value = model(mb["obs"])
    logits, value = logits.float(), value.float()
    logp_all = F.log_softmax(logits, -1)
    logp = logp_all.gather(1, mb["act"][:, None]).squeeze(1)
    ratio = torch.exp(logp - mb["logp"])
    pg = -torch.min(ratio * mb["adv"],
                    ratio.clamp(1 - args.clip_eps, 1 + args.clip_eps) * mb["adv"])
    vf = (value - mb["ret"]) ** 2
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return (pg + args.vf_coef * vf - args.ent_coef * ent).sum()


def main():
    args = PPOArgs()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    net = ActorCritic()
    model = DDP(net)
    actor_opt = torch.optim.Adam(net.actor.parameters(), lr=args.actor_lr, eps=1e-5)
    critic_opt = torch.optim.Adam(net.critic.parameters(), lr=args.critic_lr, eps=1e-5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=5)

    gen = torch.Generator().manual_seed(args.seed + 17 * rank)
    env = ReachEnv(args.n_envs, gen)
    for it in range(args.iterations):
        buf = collect(net, env, args, gen)
        n_local = buf["adv"].numel()
        # advantage whitening over the whole rollout of all ranks
        s = global_sum([n_local, buf["adv"].sum().item(), (buf["adv"] ** 2).sum().item()])
        mean = s[1] / s[0]
        std = (s[2] / s[0] - mean ** 2).clamp_min(1e-12).sqrt()
        buf["adv"] = ((buf["adv"] - mean) / (std + 1e-8)).float()
        n_global = int(s[0].item())

        for ep in range(args.ppo_epochs):
            perm = torch.randperm(n_local, generator=gen)
            chunks = torch.tensor_split(perm, args.n_micro)
            for j, idx in enumerate(chunks):
                mb = {k: v[idx] for k, v in buf.items()}
                last = j == len(chunks) - 1
                with nullcontext() if last else model.no_sync():
                    loss = ppo_loss_sum(model, mb, args) * world / n_global
                    scaler.scale(loss).backward()
            scaler.unscale_(actor_opt)
            scaler.unscale_(critic_opt)
            torch.nn.utils.clip_grad_norm_(net.actor.parameters(), args.actor_clip)
            torch.nn.utils.clip_grad_norm_(net.critic.parameters(), args.critic_clip)
            scaler.step(actor_opt)
            scaler.step(critic_opt)
            scaler.update()
            actor_opt.zero_grad(set_to_none=True)
            critic_opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"iter {it}: samples {n_global} (rank0 {n_local}) "
                  f"mean return {buf['ret'].mean():.3f} scale {scaler.get_scale():.0f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
