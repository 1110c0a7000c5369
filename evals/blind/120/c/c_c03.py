"""REINFORCE with a learned baseline on 2 spawned ranks, data parallel by hand.

No DDP wrapper: each rank accumulates K = 3 micro-batches of episodes into .grad, then one
all-reduce per window (SUM over ranks) and a division by the window's all-ranks count of
episode steps, so every step of every episode in the window weighs the same. Episodes have
different lengths. Policy on Adam, value head on SGD. After 5 optimizer steps the run saves
a checkpoint, throws every object away and resumes into freshly built ones.
"""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

OBS, ACT, T_MAX = 8, 4, 12
K, MICRO_EPISODES, TOTAL_STEPS, SAVE_AT, GAMMA, SEED = 3, 4, 10, 5, 0.97, 2024
PORT = 49211


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS, 32), nn.Tanh())
        self.pi = nn.Linear(32, ACT)
        self.v = nn.Linear(32, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def episodes(rank, step, k):
    """Synthetic fixed trajectories: observations, actions taken, rewards, lengths."""
    g = torch.Generator().manual_seed(SEED + 7919 * step + 31 * k + rank)
    lens = torch.randint(3, T_MAX + 1, (MICRO_EPISODES,), generator=g)
    obs = torch.randn(MICRO_EPISODES, T_MAX, OBS, generator=g)
    act = torch.randint(0, ACT, (MICRO_EPISODES, T_MAX), generator=g)
    rew = (act == (obs[..., 0] > 0).long()).float() + 0.1 * torch.randn(MICRO_EPISODES, T_MAX, generator=g)
    valid = (torch.arange(T_MAX)[None] < lens[:, None]).float()
    rew = rew * valid
    ret = torch.zeros_like(rew)
    run = torch.zeros(MICRO_EPISODES)
    for t in reversed(range(T_MAX)):
        run = rew[:, t] + GAMMA * run
        ret[:, t] = run
    return obs, act, ret, valid


def summed_loss(model, obs, act, ret, valid):
    logits, value = model(obs)
    logp = torch.log_softmax(logits, -1).gather(-1, act[..., None]).squeeze(-1)
    adv = (ret - value).detach()
    pg = -(logp * adv * valid).sum()
    vf = 0.5 * (((value - ret) ** 2) * valid).sum()
    return pg + vf


def build(seed):
    torch.manual_seed(seed)
    model = ActorCritic()
    pol_params = list(model.trunk.parameters()) + list(model.pi.parameters())
    opt_pi = torch.optim.Adam(pol_params, lr=3e-3)
    opt_v = torch.optim.SGD(model.v.parameters(), lr=2e-2, momentum=0.9)
    return model, opt_pi, opt_v


def train(model, opt_pi, opt_v, rank, first, last):
    for step in range(first, last):
        window = [episodes(rank, step, k) for k in range(K)]
        n = torch.tensor(sum(float(w[3].sum()) for w in window))
        dist.all_reduce(n)
        for obs, act, ret, valid in window:
            summed_loss(model, obs, act, ret, valid).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(n)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt_pi.step()
        opt_v.step()
        opt_pi.zero_grad(set_to_none=True)
        opt_v.zero_grad(set_to_none=True)


def worker(rank, world, ckpt_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, opt_pi, opt_v = build(SEED)
    train(model, opt_pi, opt_v, rank, 0, SAVE_AT)
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt_pi": opt_pi.state_dict(),
                    "opt_v": opt_v.state_dict(), "next_step": SAVE_AT}, path)
    dist.barrier()
    del model, opt_pi, opt_v

    model, opt_pi, opt_v = build(SEED + 1)  # different init: everything comes from the checkpoint
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt_pi.load_state_dict(state["opt_pi"])
    opt_v.load_state_dict(state["opt_v"])
    train(model, opt_pi, opt_v, rank, state["next_step"], TOTAL_STEPS)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, d), nprocs=2, join=True)
