"""CleanRL-style PPO update with separate actor and critic DDP modules on spawned ranks.

Two optimizers (actor, critic), bf16 autocast for the forward passes, and a
preemption checkpoint taken at an update boundary: the run is resumed into a
freshly built set of modules, optimizers and schedulers. Each PPO epoch splits
the rollout into minibatches; every minibatch is K = 2 equal micro-batches whose
means are divided by K, with both DDP modules' sync off for the first micro-batch.
Advantages are normalised over the whole rollout of all ranks.
"""
import contextlib
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACT, HID = 8, 4, 32
ROLLOUT, MINIBATCH, ACCUM, UPDATE_EPOCHS = 32, 16, 2, 2
UPDATES, RESUME_AT = 4, 2
CLIP_COEF, VF_COEF, ENT_COEF, MAX_NORM = 0.2, 0.5, 0.01, 0.5
PORT = 41207


def mlp(out):
    return nn.Sequential(nn.Linear(OBS, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, out))


class Agent:
    def __init__(self, total_updates):
        torch.manual_seed(0)
        self.actor = DDP(mlp(ACT))
        self.critic = DDP(mlp(1))
        self.opt_pi = torch.optim.Adam(self.actor.parameters(), lr=2.5e-3, eps=1e-5)
        self.opt_v = torch.optim.Adam(self.critic.parameters(), lr=1e-3, eps=1e-5)
        frac = lambda u: 1.0 - u / total_updates
        self.sched_pi = torch.optim.lr_scheduler.LambdaLR(self.opt_pi, frac)
        self.sched_v = torch.optim.lr_scheduler.LambdaLR(self.opt_v, frac)
        self.update = 0

    def state_dict(self):
        return {"actor": self.actor.module.state_dict(), "critic": self.critic.module.state_dict(),
                "opt_pi": self.opt_pi.state_dict(), "opt_v": self.opt_v.state_dict(),
                "sched_pi": self.sched_pi.state_dict(), "sched_v": self.sched_v.state_dict(),
                "update": self.update}

    def load_state_dict(self, s):
        self.actor.module.load_state_dict(s["actor"])
        self.critic.module.load_state_dict(s["critic"])
        self.opt_pi.load_state_dict(s["opt_pi"])
        self.opt_v.load_state_dict(s["opt_v"])
        self.sched_pi.load_state_dict(s["sched_pi"])
        self.sched_v.load_state_dict(s["sched_v"])
        self.update = s["update"]


@torch.no_grad()
def collect(agent, gen):
    obs = torch.randn(ROLLOUT, OBS, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = agent.actor.module(obs).float()
        values = agent.critic.module(obs).float().squeeze(-1)
    dist_ = torch.distributions.Categorical(logits=logits)
    actions = torch.multinomial(dist_.probs, 1, generator=gen).squeeze(-1)
    rewards = (actions == (obs[:, 0] > 0).long()).float() + 0.1 * obs[:, 1]
    returns = rewards
    adv = returns - values
    stats = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(adv.numel()))]).double()
    dist.all_reduce(stats)
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean * mean).clamp_min(0).sqrt()
    adv = ((adv - mean) / (std + 1e-8)).float()
    return obs, actions, dist_.log_prob(actions), adv, returns


def ppo_update(agent, batch, gen):
    obs, actions, old_logp, adv, returns = batch
    mb_micro = MINIBATCH // ACCUM
    for _ in range(UPDATE_EPOCHS):
        perm = torch.randperm(ROLLOUT, generator=gen)
        for start in range(0, ROLLOUT, MINIBATCH):
            mb = perm[start:start + MINIBATCH]
            for k in range(ACCUM):
                idx = mb[k * mb_micro:(k + 1) * mb_micro]
                last = k == ACCUM - 1
                with contextlib.ExitStack() as stack:
                    if not last:
                        stack.enter_context(agent.actor.no_sync())
                        stack.enter_context(agent.critic.no_sync())
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        logits = agent.actor(obs[idx]).float()
                        value = agent.critic(obs[idx]).float().squeeze(-1)
                    d = torch.distributions.Categorical(logits=logits)
                    ratio = (d.log_prob(actions[idx]) - old_logp[idx]).exp()
                    pg = torch.max(-adv[idx] * ratio, -adv[idx] * ratio.clamp(1 - CLIP_COEF, 1 + CLIP_COEF)).mean()
                    v_loss = 0.5 * (value - returns[idx]).pow(2).mean()
                    loss = pg - ENT_COEF * d.entropy().mean() + VF_COEF * v_loss
                    (loss / ACCUM).backward()
            nn.utils.clip_grad_norm_(agent.actor.parameters(), MAX_NORM)
            nn.utils.clip_grad_norm_(agent.critic.parameters(), MAX_NORM)
            agent.opt_pi.step()
            agent.opt_v.step()
            agent.opt_pi.zero_grad(set_to_none=True)
            agent.opt_v.zero_grad(set_to_none=True)
    agent.sched_pi.step()
    agent.sched_v.step()
    agent.update += 1


def worker(rank, world, ckpt_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    path = os.path.join(ckpt_dir, f"agent_{rank}.pt")

    agent = Agent(UPDATES)
    for u in range(RESUME_AT):
        ppo_update(agent, collect(agent, torch.Generator().manual_seed(10 * u + rank)), torch.Generator().manual_seed(u))
    torch.save(agent.state_dict(), path)
    del agent

    agent = Agent(UPDATES)
    agent.load_state_dict(torch.load(path))
    while agent.update < UPDATES:
        u = agent.update
        ppo_update(agent, collect(agent, torch.Generator().manual_seed(10 * u + rank)), torch.Generator().manual_seed(u))

    if rank == 0:
        h = hashlib.sha256()
        for _, p in agent.actor.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        for _, p in agent.critic.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    d = tempfile.mkdtemp(prefix="c_c02_")
    try:
        mp.spawn(worker, args=(2, d), nprocs=2, join=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
