"""PPO on a contextual bandit, 2 ranks via mp.spawn, no DDP wrapper.

Actor and critic are separate networks with separate optimizers (Adam / SGD+momentum).
Each rank collects its own rollout (rank 0: 44 samples, rank 1: 40), so the last window of
every PPO epoch is short and uneven across ranks.  Gradients are summed over ranks by one flat
all-reduce per window and the loss of every micro-batch is normalised by the number of samples
in the whole window across all ranks.  The actor gradient is clipped after the reduction.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributions import Categorical

OBS, ACT = 8, 4
CFG = dict(
    port=49241,
    world=2,
    rollout_sizes=(44, 40),
    minibatch=8,
    grad_accum=4,
    ppo_epochs=3,
    iterations=3,
    clip_eps=0.2,
    vf_coef=0.5,
    ent_coef=0.01,
    max_grad_norm=0.5,
    actor_lr=3e-3,
    critic_lr=5e-2,
    seed=11,
)


def mlp(out):
    return nn.Sequential(nn.Linear(OBS, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, out))


class Env:
    def __init__(self, rank, seed):
        self.g = torch.Generator().manual_seed(seed * 1000 + rank)
        self.W = torch.randn(OBS, ACT, generator=torch.Generator().manual_seed(seed))

    def sample(self, n):
        return torch.randn(n, OBS, generator=self.g)

    def reward(self, obs, act):
        scores = obs @ self.W
        return scores.gather(1, act[:, None]).squeeze(1) - scores.mean(1) + 0.1 * torch.randn(len(act), generator=self.g)


def all_reduce_flat(tensors):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)  # SUM: every loss term is already over the all-ranks count
    off = 0
    for t in tensors:
        t.copy_(flat[off:off + t.numel()].view_as(t))
        off += t.numel()


def worker(rank, cfg):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cfg["world"])
    torch.manual_seed(cfg["seed"])
    actor, critic = mlp(ACT), mlp(1)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg["actor_lr"])
    critic_opt = torch.optim.SGD(critic.parameters(), lr=cfg["critic_lr"], momentum=0.9)
    env = Env(rank, cfg["seed"])
    perm_gen = torch.Generator().manual_seed(cfg["seed"] + 7 * rank)
    n_local = cfg["rollout_sizes"][rank]
    mb, K = cfg["minibatch"], cfg["grad_accum"]
    n_updates = 0

    for it in range(cfg["iterations"]):
        # ---------------- rollout ----------------
        with torch.no_grad():
            obs = env.sample(n_local)
            dist_ = Categorical(logits=actor(obs))
            act = torch.multinomial(dist_.probs, 1, generator=perm_gen).squeeze(1)
            old_logp = dist_.log_prob(act)
            values = critic(obs).squeeze(1)
            rew = env.reward(obs, act)
            adv = rew - values
            # advantage whitening over the whole rollout of all ranks
            stats = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(n_local))])
            dist.all_reduce(stats)
            mean = stats[0] / stats[2]
            std = (stats[1] / stats[2] - mean * mean).clamp_min(1e-8).sqrt()
            adv = (adv - mean) / (std + 1e-8)
            returns = rew

        # ---------------- PPO epochs ----------------
        for epoch in range(cfg["ppo_epochs"]):
            idx = torch.randperm(n_local, generator=perm_gen)
            minibatches = [idx[i:i + mb] for i in range(0, n_local, mb)]
            windows = [minibatches[i:i + K] for i in range(0, len(minibatches), K)]
            for window in windows:
                count = torch.tensor(float(sum(len(m) for m in window)))
                dist.all_reduce(count)
                for m in window:
                    d = Categorical(logits=actor(obs[m]))
                    logp = d.log_prob(act[m])
                    ratio = (logp - old_logp[m]).exp()
                    pg = -torch.min(ratio * adv[m], ratio.clamp(1 - cfg["clip_eps"], 1 + cfg["clip_eps"]) * adv[m])
                    v = critic(obs[m]).squeeze(1)
                    vf = (v - returns[m]).pow(2)
                    loss = (pg.sum() + cfg["vf_coef"] * vf.sum() - cfg["ent_coef"] * d.entropy().sum()) / count
                    loss.backward()
                params = [p for p in list(actor.parameters()) + list(critic.parameters())]
                all_reduce_flat([p.grad for p in params])
                gn = nn.utils.clip_grad_norm_(actor.parameters(), cfg["max_grad_norm"])
                actor_opt.step()
                critic_opt.step()
                actor_opt.zero_grad(set_to_none=True)
                critic_opt.zero_grad(set_to_none=True)
                n_updates += 1
                if rank == 0 and n_updates % 6 == 0:
                    print(f"iter {it} update {n_updates} window {int(count)} loss {loss.item():.4f} "
                          f"actor_gn {gn.item():.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in list(actor.named_parameters()) + list(critic.named_parameters()):
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(CFG,), nprocs=CFG["world"], join=True)
