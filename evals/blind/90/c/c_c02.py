"""PPO update phase with an actor and a critic as two DDP modules on 2 ranks (torchrun).

Two Adam optimizers, K = 3 minibatches per update; advantages are whitened over the whole
rollout of both ranks. After 6 updates everything is checkpointed, the objects are thrown
away, and training resumes into freshly built modules, optimizers and schedulers.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACT = 8, 4
MB, K = 16, 3
TOTAL_UPDATES, RESUME_AT = 12, 6
CLIP_EPS, VF_COEF = 0.2, 0.5


def mlp(i, o):
    return nn.Sequential(nn.Linear(i, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, o))


class Learner:
    def __init__(self, rank):
        torch.manual_seed(3)
        self.actor = DDP(mlp(OBS, ACT))
        self.critic = DDP(mlp(OBS, 1))
        self.opt_pi = torch.optim.Adam(self.actor.parameters(), lr=1e-3, eps=1e-5)
        self.opt_v = torch.optim.Adam(self.critic.parameters(), lr=2e-3, eps=1e-5)
        lin = lambda u: 1.0 - u / TOTAL_UPDATES
        self.s_pi = torch.optim.lr_scheduler.LambdaLR(self.opt_pi, lin)
        self.s_v = torch.optim.lr_scheduler.LambdaLR(self.opt_v, lin)
        self.updates = 0

    def state(self):
        return {"actor": self.actor.module.state_dict(), "critic": self.critic.module.state_dict(),
                "opt_pi": self.opt_pi.state_dict(), "opt_v": self.opt_v.state_dict(),
                "s_pi": self.s_pi.state_dict(), "s_v": self.s_v.state_dict(), "updates": self.updates}

    def load(self, sd):
        self.actor.module.load_state_dict(sd["actor"])
        self.critic.module.load_state_dict(sd["critic"])
        self.opt_pi.load_state_dict(sd["opt_pi"])
        self.opt_v.load_state_dict(sd["opt_v"])
        self.s_pi.load_state_dict(sd["s_pi"])
        self.s_v.load_state_dict(sd["s_v"])
        self.updates = sd["updates"]


def rollout(update, rank):
    g = torch.Generator().manual_seed(500 + 10 * update + rank)
    n = MB * K
    obs = torch.randn(n, OBS, generator=g)
    act = torch.randint(0, ACT, (n,), generator=g)
    old_logp = torch.log(torch.full((n,), 1.0 / ACT)) + 0.05 * torch.randn(n, generator=g)
    ret = torch.randn(n, generator=g) + obs[:, 0]
    adv = ret - 0.3 * torch.randn(n, generator=g)
    # whiten over the rollout of every rank
    stats = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(n))])
    dist.all_reduce(stats)
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean ** 2).clamp(min=1e-8).sqrt()
    return obs, act, old_logp, ret, (adv - mean) / (std + 1e-8)


def ppo_update(L, rank):
    obs, act, old_logp, ret, adv = rollout(L.updates, rank)
    for k in range(K):
        sl = slice(k * MB, (k + 1) * MB)
        sync = k == K - 1
        L.actor.require_backward_grad_sync = sync
        L.critic.require_backward_grad_sync = sync
        logp = torch.log_softmax(L.actor(obs[sl]), -1).gather(1, act[sl, None]).squeeze(1)
        ratio = (logp - old_logp[sl]).exp()
        pg = -torch.min(ratio * adv[sl], ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv[sl]).mean()
        v = L.critic(obs[sl]).squeeze(1)
        vf = VF_COEF * (v - ret[sl]).pow(2).mean()
        ((pg + vf) / K).backward()
    for opt, s in ((L.opt_pi, L.s_pi), (L.opt_v, L.s_v)):
        opt.step()
        s.step()
        opt.zero_grad(set_to_none=True)
    L.updates += 1


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    ckdir = tempfile.mkdtemp(prefix="c_c02_") if rank == 0 else None
    box = [ckdir]
    dist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "learner.pt")

    L = Learner(rank)
    while L.updates < RESUME_AT:
        ppo_update(L, rank)
    if rank == 0:
        torch.save(L.state(), path)
    dist.barrier()
    del L

    L = Learner(rank)  # fresh objects
    L.load(torch.load(path, weights_only=False))
    while L.updates < TOTAL_UPDATES:
        ppo_update(L, rank)

    if rank == 0:
        h = hashlib.sha256()
        for m in (L.actor.module, L.critic.module):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"updates {L.updates} lr_pi {L.s_pi.get_last_lr()[0]:.2e}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
