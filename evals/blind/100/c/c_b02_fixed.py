"""PPO update phase with an adaptive KL penalty whose coefficient is set per window.

torchrun launches 2 ranks; the policy is DDP-wrapped. Each optimizer step consumes a window
of K minibatches per rank. The KL coefficient for the window is decided from the window's
measured KL (over all ranks) before any backward, so the trainer runs all K forwards first
and the backwards afterwards.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=10)
    p.add_argument("--n-actions", type=int, default=5)
    p.add_argument("--minibatch-size", type=int, default=16)
    p.add_argument("--accum-steps", type=int, default=3)
    p.add_argument("--updates", type=int, default=4)
    p.add_argument("--steps-per-update", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--kl-target", type=float, default=0.01)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Actor(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                 nn.Linear(64, n_actions))

    def forward(self, obs):
        return torch.log_softmax(self.net(obs), dim=-1)


class PPOLearner:
    def __init__(self, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        torch.manual_seed(args.seed)
        self.actor = Actor(args.obs_dim, args.n_actions)
        self.policy = DDP(self.actor)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=args.lr, eps=1e-5)
        self.gen = torch.Generator().manual_seed(args.seed * 100 + rank)

    @torch.no_grad()
    def collect(self):
        a = self.args
        n = a.minibatch_size * a.accum_steps * a.steps_per_update
        obs = torch.randn(n, a.obs_dim, generator=self.gen)
        old_logp_all = self.actor(obs)
        actions = torch.multinomial(old_logp_all.exp(), 1, generator=self.gen).squeeze(1)
        adv = torch.randn(n, generator=self.gen) + 0.3 * obs[:, 0]
        return obs, actions, old_logp_all, adv

    def window_forward(self, window):
        """Forward every minibatch of the window; sync only on the last one."""
        outs = []
        for i, (obs, act, old_logp_all, adv) in enumerate(window):
            last = i == len(window) - 1
            ctx = contextlib.nullcontext() if last else self.policy.no_sync()
            with ctx:
                logp_all = self.policy(obs)
            outs.append(logp_all)
        return outs

    def window_kl(self, window, outs):
        kl_sum = torch.zeros(2)
        for (obs, act, old_logp_all, adv), logp_all in zip(window, outs):
            kl = (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1)
            kl_sum += torch.stack([kl.detach().sum(), torch.tensor(float(kl.numel()))])
        dist.all_reduce(kl_sum)
        return (kl_sum[0] / kl_sum[1]).item()

    def minibatch_loss(self, mb, logp_all, beta):
        obs, act, old_logp_all, adv = mb
        a = self.args
        logp = logp_all.gather(1, act[:, None]).squeeze(1)
        old_logp = old_logp_all.gather(1, act[:, None]).squeeze(1)
        ratio = (logp - old_logp).exp()
        pg = -torch.min(ratio * adv, ratio.clamp(1 - a.clip_coef, 1 + a.clip_coef) * adv).mean()
        kl = (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1).mean()
        ent = -(logp_all.exp() * logp_all).sum(-1).mean()
        return pg + beta * kl - a.ent_coef * ent

    def update(self, rollout):
        a = self.args
        obs, actions, old_logp_all, adv = rollout
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        mbs = [(obs[i:i + a.minibatch_size], actions[i:i + a.minibatch_size],
                old_logp_all[i:i + a.minibatch_size], adv[i:i + a.minibatch_size])
               for i in range(0, len(obs), a.minibatch_size)]
        for w in range(0, len(mbs), a.accum_steps):
            window = mbs[w:w + a.accum_steps]
            outs = self.window_forward(window)
            mean_kl = self.window_kl(window, outs)
            beta = 0.5 if mean_kl < a.kl_target else 2.0
            self.opt.zero_grad(set_to_none=True)
            losses = [self.minibatch_loss(mb, logp_all, beta) / len(window)
                      for mb, logp_all in zip(window, outs)]
            torch.stack(losses).sum().backward()
            self.opt.step()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    learner = PPOLearner(args, rank, world)
    for _ in range(args.updates):
        learner.update(learner.collect())
    if rank == 0:
        h = hashlib.sha256()
        for _, p in learner.actor.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in learner.actor.named_parameters()},
                       os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
