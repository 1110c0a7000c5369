"""Accelerate actor-critic (advantage-weighted regression) on 2 CPU processes.

Two prepared models and two prepared optimizers accumulate together; the actor's input
normaliser is frozen; a prepared scheduler; clipping on the sync step only; DataLoader workers.
"""
import hashlib
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed

CFG = dict(seed=3, obs_dim=10, n_actions=4, n_samples=192, micro_batch=8, accum=3,
           epochs=2, actor_lr=1e-3, critic_lr=5e-3, beta=1.0, clip=0.5)


class Transitions(Dataset):
    def __init__(self, n, obs_dim, n_actions, seed):
        g = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n, obs_dim, generator=g)
        self.act = torch.randint(0, n_actions, (n,), generator=g)
        self.ret = torch.randn(n, generator=g) + self.obs[:, 0]

    def __len__(self):
        return len(self.obs)

    def __getitem__(self, i):
        return self.obs[i], self.act[i], self.ret[i]


class Actor(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.norm = nn.LayerNorm(obs_dim)
        self.body = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, n_actions))

    def forward(self, obs):
        return self.body(self.norm(obs))


class Critic(nn.Module):
    def __init__(self, obs_dim):
        super().__init__()
        self.v = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs):
        return self.v(obs).squeeze(-1)


def main():
    c = CFG
    acc = Accelerator(cpu=True, gradient_accumulation_steps=c["accum"])
    set_seed(c["seed"])
    actor, critic = Actor(c["obs_dim"], c["n_actions"]), Critic(c["obs_dim"])
    for p in actor.norm.parameters():
        p.requires_grad_(False)
    opt_a = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=c["actor_lr"])
    opt_c = torch.optim.AdamW(critic.parameters(), lr=c["critic_lr"])
    loader = DataLoader(Transitions(c["n_samples"], c["obs_dim"], c["n_actions"], c["seed"]),
                        batch_size=c["micro_batch"], shuffle=False, num_workers=1)
    # per process: 192 / 2 / 8 = 12 micro-batches = 4 windows of 3 per epoch
    updates = c["epochs"] * math.ceil(len(loader) / acc.num_processes / c["accum"])
    sched_a = torch.optim.lr_scheduler.LambdaLR(
        opt_a, lambda s: max(0.0, 1.0 - s / (updates * acc.num_processes)))
    actor, critic, opt_a, opt_c, sched_a, loader = acc.prepare(actor, critic, opt_a, opt_c, sched_a, loader)

    for epoch in range(c["epochs"]):
        for obs, act, ret in loader:
            with acc.accumulate(actor, critic):
                value = critic(obs)
                adv = (ret - value).detach()
                weights = torch.exp(adv / c["beta"]).clamp(max=20.0)
                logp = torch.log_softmax(actor(obs), -1).gather(1, act[:, None]).squeeze(1)
                policy_loss = -(weights * logp).mean()
                value_loss = 0.5 * (ret - value).pow(2).mean()
                acc.backward(policy_loss + value_loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(actor.parameters(), c["clip"])
                    acc.clip_grad_norm_(critic.parameters(), c["clip"])
                opt_a.step()
                opt_c.step()
                sched_a.step()
                opt_a.zero_grad()
                opt_c.zero_grad()
        acc.print(f"epoch {epoch} pl {policy_loss.item():.4f} vl {value_loss.item():.4f}")

    acc.wait_for_everyone()
    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(actor), acc.unwrap_model(critic)):
            for _, p in m.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
