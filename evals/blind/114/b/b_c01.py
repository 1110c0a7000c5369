"""Actor-critic on variable-length synthetic episodes, DDP, hand accumulation.

Each window of K micro-batches is read ahead so that the loss can be normalised
by the number of valid timesteps in the whole window across all ranks; the
epoch has 8 micro-batches per rank, so with K = 3 its windows hold 3, 3 and 2.
Policy trunk on AdamW, value head on SGD, one global-norm clip per update.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

OBS, ACTS, HID = 10, 4, 32
K = 3
EPISODES_PER_MB = 3
MB_PER_EPOCH = 8
EPOCHS = 3
GAMMA = 0.95
VF_COEF = 0.5
CLIP = 0.5


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh())
        self.pi = nn.Linear(HID, ACTS)
        self.v = nn.Linear(HID, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def make_rollouts(rank):
    """Padded episodes of 2..9 steps: obs, actions, discounted returns, mask."""
    g = torch.Generator().manual_seed(500 + rank)
    mbs = []
    for _ in range(EPOCHS * MB_PER_EPOCH):
        lens = torch.randint(2, 10, (EPISODES_PER_MB,), generator=g)
        T = int(lens.max())
        obs = torch.randn(EPISODES_PER_MB, T, OBS, generator=g)
        act = torch.randint(0, ACTS, (EPISODES_PER_MB, T), generator=g)
        rew = (act == (obs[..., 0] > 0).long()).float() + 0.1 * torch.randn(EPISODES_PER_MB, T, generator=g)
        mask = (torch.arange(T)[None, :] < lens[:, None]).float()
        rew = rew * mask
        ret = torch.zeros_like(rew)
        run = torch.zeros(EPISODES_PER_MB)
        for t in reversed(range(T)):
            run = rew[:, t] + GAMMA * run
            ret[:, t] = run
        mbs.append(dict(obs=obs, act=act, ret=ret, mask=mask))
    return mbs


def windows(epoch_mbs, k):
    for i in range(0, len(epoch_mbs), k):
        yield epoch_mbs[i:i + k]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    net = ActorCritic()
    model = DDP(net)
    pi_params = list(net.trunk.parameters()) + list(net.pi.parameters())
    opt_pi = torch.optim.AdamW(pi_params, lr=3e-3, weight_decay=0.01)
    opt_v = torch.optim.SGD(net.v.parameters(), lr=0.05, momentum=0.9)
    rollouts = make_rollouts(rank)

    updates = 0
    for epoch in range(EPOCHS):
        epoch_mbs = rollouts[epoch * MB_PER_EPOCH:(epoch + 1) * MB_PER_EPOCH]
        for win in windows(epoch_mbs, K):
            n_valid = torch.stack([mb["mask"].sum() for mb in win]).sum()
            dist.all_reduce(n_valid, op=dist.ReduceOp.SUM)
            for j, mb in enumerate(win):
                last = j == len(win) - 1
                with (nullcontext() if last else model.no_sync()):
                    logits, value = model(mb["obs"])
                    logp = torch.distributions.Categorical(logits=logits).log_prob(mb["act"])
                    adv = (mb["ret"] - value).detach()
                    pg = -(logp * adv * mb["mask"]).sum()
                    vf = ((value - mb["ret"]) ** 2 * mb["mask"]).sum()
                    # DDP averages over ranks, hence * world
                    loss = (pg + VF_COEF * vf) * world / n_valid
                    loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt_pi.step()
            opt_v.step()
            opt_pi.zero_grad(set_to_none=True)
            opt_v.zero_grad(set_to_none=True)
            updates += 1
            if rank == 0:
                print(f"epoch {epoch} update {updates} window {len(win)} grad-norm {gnorm:.3f}")

    h = hashlib.sha256()
    for _, p in net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
