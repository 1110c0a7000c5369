"""PPO with separate actor and critic networks on 2 DDP ranks.

Layout: a RolloutWorker collects synthetic episodes, learners own one network
and one optimizer each, and PPOTrainer runs the epochs / minibatch windows.
Gradients are accumulated over `grad_accum` minibatches per optimizer step.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--obs-dim", type=int, default=8)
    p.add_argument("--n-actions", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--rollout-len", type=int, default=64)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=2)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--actor-lr", type=float, default=3e-3)
    p.add_argument("--critic-lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Actor(nn.Module):
    def __init__(self, obs_dim, hidden, n_actions):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))

    def forward(self, obs):
        return self.net(obs)


class Critic(nn.Module):
    def __init__(self, obs_dim, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


class Agent(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.actor = Actor(args.obs_dim, args.hidden, args.n_actions)
        self.critic = Critic(args.obs_dim, args.hidden)


def maybe_no_sync(ddp_module, sync):
    return contextlib.nullcontext() if sync else ddp_module.no_sync()


class RolloutWorker:
    """Synthetic episodic environment: reward depends on obs and action."""

    def __init__(self, args, rank):
        self.args = args
        self.rank = rank
        self.w_env = torch.Generator().manual_seed(99)
        self.reward_table = torch.randn(args.obs_dim, args.n_actions, generator=self.w_env)

    @torch.no_grad()
    def collect(self, actor, critic, iteration):
        a = self.args
        g = torch.Generator().manual_seed(a.seed * 1000 + iteration * 10 + self.rank)
        obs = torch.randn(a.rollout_len, a.obs_dim, generator=g)
        logits = actor(obs)
        probs = F.softmax(logits, -1)
        actions = torch.multinomial(probs, 1, generator=g).squeeze(-1)
        logp = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
        rewards = (obs @ self.reward_table).gather(-1, actions[:, None]).squeeze(-1)
        rewards = rewards + 0.1 * torch.randn(a.rollout_len, generator=g)
        dones = torch.zeros(a.rollout_len)
        dones[7::8] = 1.0
        values = critic(obs)
        returns = torch.zeros(a.rollout_len)
        running = 0.0
        for t in reversed(range(a.rollout_len)):
            running = rewards[t] + a.gamma * running * (1.0 - dones[t])
            returns[t] = running
        adv = returns - values
        # advantage whitening over the whole rollout of all ranks
        stats = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(adv.numel()))])
        dist.all_reduce(stats)
        mean = stats[0] / stats[2]
        std = (stats[1] / stats[2] - mean * mean).clamp_min(1e-8).sqrt()
        adv = (adv - mean) / (std + 1e-8)
        return dict(obs=obs, actions=actions, logp=logp, adv=adv, returns=returns, values=values)


class BaseLearner:
    def __init__(self, module, opt, grad_accum):
        self.ddp = DDP(module)
        self.opt = opt
        self.grad_accum = grad_accum

    def loss(self, mb):
        raise NotImplementedError

    def backward(self, mb, sync):
        with maybe_no_sync(self.ddp, sync):
            loss = self.loss(mb) / self.grad_accum
            loss.backward()
        return loss.detach()

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train_on(self, mb):
        """One full update on a single minibatch (no accumulation)."""
        out = self.backward(mb, sync=True)
        self.step()
        return out


class PolicyLearner(BaseLearner):
    def __init__(self, module, opt, grad_accum, clip_coef, ent_coef):
        super().__init__(module, opt, grad_accum)
        self.clip_coef, self.ent_coef = clip_coef, ent_coef

    def loss(self, mb):
        logits = self.ddp(mb["obs"])
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, mb["actions"][:, None]).squeeze(-1)
        ratio = (logp - mb["logp"]).exp()
        pg1 = -mb["adv"] * ratio
        pg2 = -mb["adv"] * ratio.clamp(1 - self.clip_coef, 1 + self.clip_coef)
        pg_loss = torch.max(pg1, pg2).mean()
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        return pg_loss - self.ent_coef * entropy


class ValueLearner(BaseLearner):
    def __init__(self, module, opt, grad_accum, clip_coef, vf_coef):
        super().__init__(module, opt, grad_accum)
        self.clip_coef, self.vf_coef = clip_coef, vf_coef

    def loss(self, mb):
        v = self.ddp(mb["obs"])
        v_clipped = mb["values"] + (v - mb["values"]).clamp(-self.clip_coef, self.clip_coef)
        v_loss = torch.max((v - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
        return self.vf_coef * 0.5 * v_loss


class PPOTrainer:
    def __init__(self, args, rank):
        self.args = args
        torch.manual_seed(args.seed)
        self.agent = Agent(args)
        self.policy = PolicyLearner(
            self.agent.actor, torch.optim.Adam(self.agent.actor.parameters(), lr=args.actor_lr, eps=1e-5),
            args.grad_accum, args.clip_coef, args.ent_coef)
        self.value = ValueLearner(
            self.agent.critic, torch.optim.Adam(self.agent.critic.parameters(), lr=args.critic_lr, eps=1e-5),
            args.grad_accum, args.clip_coef, args.vf_coef)
        self.worker = RolloutWorker(args, rank)

    def _minibatches(self, batch, epoch, iteration):
        g = torch.Generator().manual_seed(iteration * 100 + epoch)
        perm = torch.randperm(self.args.rollout_len, generator=g)
        for start in range(0, self.args.rollout_len, self.args.minibatch):
            idx = perm[start:start + self.args.minibatch]
            yield {k: v[idx] for k, v in batch.items()}

    def _micro_step(self, mb, sync):
        self.policy.backward(mb, sync)
        self.value.train_on(mb)

    def _optimizer_step(self):
        self.policy.step()
        self.value.step()

    def fit(self):
        a = self.args
        n_updates = 0
        for it in range(a.iterations):
            batch = self.worker.collect(self.agent.actor, self.agent.critic, it)
            for epoch in range(a.update_epochs):
                for i, mb in enumerate(self._minibatches(batch, epoch, it)):
                    last = (i + 1) % a.grad_accum == 0
                    self._micro_step(mb, sync=last)
                    if last:
                        self._optimizer_step()
                        n_updates += 1
        return n_updates


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer = PPOTrainer(args, rank)
    trainer.fit()
    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(trainer.agent)}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
