"""PPO on a contextual bandit, actor and critic as two DDP modules with two
optimizers, 2 ranks via torchrun.

Each rank collects its own rollout; advantages are whitened over the whole
rollout of all ranks.  Every PPO epoch walks the shuffled rollout in
micro-batches of equal size, K of them per optimizer step (the loss is the
window mean: each micro-batch's mean / K).  The actor has a linearly decaying
LR stepped once per update and its gradient clipped once per window.
"""
import contextlib
import hashlib
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=6)
    p.add_argument("--n-actions", type=int, default=4)
    p.add_argument("--rollout", type=int, default=24)
    p.add_argument("--minibatch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--ppo-epochs", type=int, default=2)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    return p.parse_args()


class Actor(nn.Module):
    def __init__(self, o, a):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(o, 32), nn.Tanh(), nn.Linear(32, a))

    def forward(self, obs):
        return torch.distributions.Categorical(logits=self.net(obs))


class Critic(nn.Module):
    def __init__(self, o):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(o, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


class Bandit:
    def __init__(self, o, a):
        self.w = torch.randn(a, o, generator=torch.Generator().manual_seed(123))

    def reward(self, obs, act):
        best = (obs @ self.w.T).argmax(-1)
        return (act == best).float() - 0.1 * (act - best).abs().float()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    actor, critic = DDP(Actor(args.obs_dim, args.n_actions)), DDP(Critic(args.obs_dim))
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    c_opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    n_updates = args.iterations * args.ppo_epochs * (args.rollout // args.minibatch // args.grad_accum)
    a_sched = torch.optim.lr_scheduler.LambdaLR(a_opt, lambda u: 1.0 - u / n_updates)
    env = Bandit(args.obs_dim, args.n_actions)
    g = torch.Generator().manual_seed(500 + rank)

    for it in range(args.iterations):
        with torch.no_grad():
            obs = torch.randn(args.rollout, args.obs_dim, generator=g)
            dist_ = actor.module(obs)
            act = torch.multinomial(dist_.probs, 1, generator=g).squeeze(1)
            old_logp = dist_.log_prob(act)
            rew = env.reward(obs, act)
            adv = rew - critic.module(obs)
            stats = torch.stack([adv.sum(), (adv ** 2).sum(), torch.tensor(float(adv.numel()))])
            dist.all_reduce(stats)
            mean = stats[0] / stats[2]
            std = (stats[1] / stats[2] - mean ** 2).clamp_min(1e-8).sqrt()
            adv = (adv - mean) / (std + 1e-8)

        for ep in range(args.ppo_epochs):
            perm = torch.randperm(args.rollout, generator=g)
            mbs = perm.split(args.minibatch)
            for w0 in range(0, len(mbs), args.grad_accum):
                window = mbs[w0:w0 + args.grad_accum]
                for i, idx in enumerate(window):
                    sync = i == len(window) - 1
                    with contextlib.ExitStack() as stack:
                        if not sync:
                            stack.enter_context(actor.no_sync())
                            stack.enter_context(critic.no_sync())
                        d = actor(obs[idx])
                        ratio = (d.log_prob(act[idx]) - old_logp[idx]).exp()
                        pg = -torch.min(ratio * adv[idx],
                                        ratio.clamp(1 - args.clip_eps, 1 + args.clip_eps) * adv[idx]).mean()
                        v_loss = 0.5 * (critic(obs[idx]) - rew[idx]).pow(2).mean()
                        loss = pg - args.ent_coef * d.entropy().mean() + v_loss
                        (loss / args.grad_accum).backward()
                torch.nn.utils.clip_grad_norm_(actor.parameters(), args.max_grad_norm)
                a_opt.step()
                c_opt.step()
                a_sched.step()
                a_opt.zero_grad(set_to_none=True)
                c_opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for mod in (actor.module, critic.module):
            for _, p in mod.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
