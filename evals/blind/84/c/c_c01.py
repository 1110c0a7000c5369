"""PPO update phase on spawned DDP ranks: separate actor and critic, two optimizers,
bf16 autocast, clipping after the window, and an epoch whose last window is short.

Each rank holds a rollout buffer of 22 minibatches; with K = 4 every PPO epoch ends in a
window of 2 minibatches. A window's loss is the mean over all samples of the window on
all ranks, so each micro-batch is divided by the number of micro-batches actually in
its window (DDP averages over the ranks).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACTIONS, HIDDEN = 10, 5, 64


class Args:
    minibatch = 8
    minibatches_per_rank = 22
    accum = 4
    ppo_epochs = 2
    clip_coef = 0.2
    ent_coef = 0.01
    vf_coef = 0.5
    actor_lr = 3e-3
    critic_lr = 1e-2
    max_grad_norm = 0.5


def mlp(out):
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, out))


def make_buffer(rank, actor, critic, a):
    g = torch.Generator().manual_seed(99 + rank)
    n = a.minibatch * a.minibatches_per_rank
    obs = torch.randn(n, OBS, generator=g)
    with torch.no_grad():
        dist_ = torch.distributions.Categorical(logits=actor(obs))
        actions = torch.multinomial(dist_.probs, 1, generator=g).squeeze(1)
        logp = dist_.log_prob(actions)
        values = critic(obs).squeeze(-1)
    rewards = obs[:, 0] * (actions == 1).float() - 0.3 * obs[:, 1] + 0.1 * torch.randn(n, generator=g)
    returns = rewards + 0.5 * values
    adv = returns - values
    return dict(obs=obs, actions=actions, logp=logp, returns=returns, adv=adv)


def worker(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a = Args()
    torch.manual_seed(5)
    actor, critic = mlp(ACTIONS), mlp(1)
    actor_ddp, critic_ddp = DDP(actor), DDP(critic)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=a.actor_lr, eps=1e-5)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=a.critic_lr, eps=1e-5)
    buf = make_buffer(rank, actor, critic, a)
    # advantages normalised over the whole rollout of all ranks
    s = torch.stack([buf["adv"].sum(), (buf["adv"] ** 2).sum(), torch.tensor(float(len(buf["adv"])))])
    dist.all_reduce(s)
    mean = s[0] / s[2]
    std = (s[1] / s[2] - mean ** 2).sqrt()
    buf["adv"] = (buf["adv"] - mean) / (std + 1e-8)

    steps = 0
    for epoch in range(a.ppo_epochs):
        perm = torch.randperm(len(buf["obs"]), generator=torch.Generator().manual_seed(epoch * 7 + rank))
        mbs = [perm[i:i + a.minibatch] for i in range(0, len(perm), a.minibatch)]
        for w0 in range(0, len(mbs), a.accum):
            window = mbs[w0:w0 + a.accum]
            for j, idx in enumerate(window):
                last = j == len(window) - 1
                actor_ddp.require_backward_grad_sync = last
                critic_ddp.require_backward_grad_sync = last
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = actor_ddp(buf["obs"][idx])
                    value = critic_ddp(buf["obs"][idx]).squeeze(-1)
                d = torch.distributions.Categorical(logits=logits.float())
                ratio = (d.log_prob(buf["actions"][idx]) - buf["logp"][idx]).exp()
                adv = buf["adv"][idx]
                pg = -torch.min(ratio * adv, ratio.clamp(1 - a.clip_coef, 1 + a.clip_coef) * adv).mean()
                v_loss = 0.5 * ((value.float() - buf["returns"][idx]) ** 2).mean()
                loss = pg - a.ent_coef * d.entropy().mean() + a.vf_coef * v_loss
                (loss / len(window)).backward()
            nn.utils.clip_grad_norm_(actor.parameters(), a.max_grad_norm)
            nn.utils.clip_grad_norm_(critic.parameters(), a.max_grad_norm)
            actor_opt.step()
            critic_opt.step()
            actor_opt.zero_grad(set_to_none=True)
            critic_opt.zero_grad(set_to_none=True)
            steps += 1
        if rank == 0:
            print(f"epoch {epoch} optimizer steps {steps} last loss {loss.item():.4f}", flush=True)

    if rank == 0:
        named = list(actor.named_parameters()) + list(critic.named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=38207)
    args = p.parse_args()
    mp.spawn(worker, args=(2, args.port), nprocs=2, join=True)
