"""Advantage actor-critic on a toy bandit with Lightning Fabric, 2 DDP ranks, separate
actor and critic modules with their own optimizers. Ranks hold different numbers of rows
per micro-batch (3 and 5); a rollout is 8 micro-batches, stepped in windows of 3-3-2, each
window's loss a sum over rows divided by the window's row count on all ranks (x W, since
DDP averages).
"""
import hashlib
from contextlib import ExitStack

import torch
import torch.nn as nn
from lightning_fabric import Fabric

OBS, ACT, H = 6, 3, 24
K, MICRO_PER_ROLLOUT, ROLLOUTS = 3, 8, 3
ROWS_PER_RANK = (3, 5)


def rollout(gen, rows, actor):
    proj = torch.randn(OBS, ACT, generator=torch.Generator().manual_seed(99))
    obs = torch.randn(MICRO_PER_ROLLOUT, rows, OBS, generator=gen)
    with torch.no_grad():
        probs = torch.softmax(actor(obs), -1)
    act = torch.multinomial(probs.reshape(-1, ACT), 1, generator=gen).reshape(MICRO_PER_ROLLOUT, rows)
    rew = (act == (obs @ proj).argmax(-1)).float()
    return list(zip(obs, act, rew))


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(3)
    rank, world = fabric.global_rank, fabric.world_size

    actor = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, ACT))
    critic = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, 1))
    opt_a = torch.optim.Adam(actor.parameters(), lr=3e-3)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.05, momentum=0.5)
    actor, opt_a = fabric.setup(actor, opt_a)
    critic, opt_c = fabric.setup(critic, opt_c)

    gen = torch.Generator().manual_seed(50 + rank)
    rows = ROWS_PER_RANK[rank]
    for r in range(ROLLOUTS):
        data = rollout(gen, rows, actor)
        for w0 in range(0, MICRO_PER_ROLLOUT, K):
            window = data[w0:w0 + K]
            n_rows = fabric.all_reduce(torch.tensor(float(len(window) * rows)), reduce_op="sum")
            for j, (obs, act, rew) in enumerate(window):
                last = j == len(window) - 1
                with ExitStack() as stack:
                    stack.enter_context(fabric.no_backward_sync(actor, enabled=not last))
                    stack.enter_context(fabric.no_backward_sync(critic, enabled=not last))
                    value = critic(obs).squeeze(-1)
                    adv = (rew - value).detach()
                    logp = torch.log_softmax(actor(obs), -1).gather(-1, act[:, None]).squeeze(-1)
                    pg = -(logp * adv).sum()
                    vf = 0.5 * (rew - value).pow(2).sum()
                    fabric.backward((pg + vf) * world / n_rows)
            fabric.clip_gradients(actor, opt_a, max_norm=0.5)
            opt_a.step()
            opt_c.step()
            opt_a.zero_grad()
            opt_c.zero_grad()
        fabric.print(f"rollout {r}: reward {torch.stack([d[2] for d in data]).mean():.3f}")

    if rank == 0:
        params = list(actor.module.named_parameters()) + list(critic.module.named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in params])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
