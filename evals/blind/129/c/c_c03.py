"""Advantage actor-critic with Lightning Fabric on 2 CPU ranks, hand-generated rollouts.

- actor and critic are set up as two separate Fabric modules with their own
  optimizers (Adam for the actor, SGD+momentum for the critic);
- the ranks collect rollouts of different lengths (rank 0: 6 steps, rank 1: 10 steps
  per micro-batch), so every loss is a sum over rows divided by the window's row
  count summed over both ranks, times the world size (DDP averages);
- only the actor's sync is deferred with no_backward_sync; the critic all-reduces
  after every micro-step, which is slower but sums to the same gradient.
"""
import hashlib

import torch
import torch.nn as nn
from lightning_fabric import Fabric

OBS, ACT, HID = 10, 4, 32
K = 2
UPDATES = 12
ROWS_PER_RANK = (6, 10)
GAMMA = 0.9
SEED = 5


def mlp(i, o):
    return nn.Sequential(nn.Linear(i, HID), nn.Tanh(), nn.Linear(HID, o))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(OBS, ACT)

    def forward(self, obs, act):
        return torch.distributions.Categorical(logits=self.net(obs)).log_prob(act)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(OBS, 1)

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


def rollout(gen, n):
    obs = torch.randn(n, OBS, generator=gen)
    act = torch.randint(0, ACT, (n,), generator=gen)
    rew = (obs.gather(1, (act % OBS)[:, None]).squeeze(1))
    ret = torch.zeros(n)
    run = torch.zeros(())
    for t in reversed(range(n)):
        run = rew[t] + GAMMA * run
        ret[t] = run
    return obs, act, ret


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(SEED)
    rank, world = fabric.global_rank, fabric.world_size

    actor, critic = Actor(), Critic()
    opt_a = torch.optim.Adam(actor.parameters(), lr=3e-3)
    opt_c = torch.optim.SGD(critic.parameters(), lr=1e-2, momentum=0.9)
    actor, opt_a = fabric.setup(actor, opt_a)
    critic, opt_c = fabric.setup(critic, opt_c)

    gen = torch.Generator().manual_seed(SEED + 101 * rank)
    n_rows = ROWS_PER_RANK[rank]
    for update in range(UPDATES):
        window = [rollout(gen, n_rows) for _ in range(K)]
        rows = fabric.all_reduce(torch.tensor(float(K * n_rows)), reduce_op="sum")
        scale = world / rows
        for j, (obs, act, ret) in enumerate(window):
            last = j == K - 1
            value = critic(obs)
            adv = (ret - value).detach()
            critic_loss = 0.5 * ((value - ret) ** 2).sum() * scale
            fabric.backward(critic_loss)
            with fabric.no_backward_sync(actor, enabled=not last):
                actor_loss = -(actor(obs, act) * adv).sum() * scale
                fabric.backward(actor_loss)
        opt_a.step()
        opt_c.step()
        opt_a.zero_grad()
        opt_c.zero_grad()

    sha = param_sha(torch.nn.ModuleDict({"actor": actor.module, "critic": critic.module}))
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")


if __name__ == "__main__":
    main()
