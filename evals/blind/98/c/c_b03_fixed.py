"""RLOO policy-gradient on a synthetic contextual bandit, two spawned ranks, no DDP.

Gradient sync is done by hand and overlapped with the backward: every parameter
gets a post-accumulate-grad hook that all-reduces (SUM) its gradient as soon as it
is ready; the step divides by the world size. K micro-batches of prompts per update.
"""
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


@dataclass
class RLOOConfig:
    obs_dim: int = 16
    n_actions: int = 8
    prompts_per_micro: int = 6
    samples_per_prompt: int = 4
    grad_accum: int = 3
    updates: int = 12
    lr: float = 1e-2
    kl_coef: float = 0.05
    port: int = 0
    seed: int = 3


class Policy(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(cfg.obs_dim, 64), nn.Tanh(),
                                 nn.Linear(64, 64), nn.Tanh(),
                                 nn.Linear(64, cfg.n_actions))

    def forward(self, obs):
        return torch.log_softmax(self.net(obs), -1)


class GradSync:
    """Overlap the gradient all-reduce with backward via per-parameter hooks."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size()
        self.enabled = False
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    def _hook(self, p):
        if self.enabled:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def finalize(self):
        for p in self.params:
            p.grad.div_(self.world)


def reward_fn(obs, actions, w_true):
    # deterministic reward: the "right" action is argmax of a hidden linear map
    best = (obs @ w_true).argmax(-1, keepdim=True)
    return (actions == best).float() - 0.1 * (actions - best).abs().float() / 8


def run(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(cfg.seed)
    policy = Policy(cfg)
    ref = Policy(cfg)
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False)
    w_true = torch.randn(cfg.obs_dim, cfg.n_actions, generator=torch.Generator().manual_seed(99))
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    sync = GradSync(policy.parameters())
    gen = torch.Generator().manual_seed(1000 + rank)

    G = cfg.samples_per_prompt
    for update in range(cfg.updates):
        opt.zero_grad(set_to_none=True)
        for micro in range(cfg.grad_accum):
            obs = torch.randn(cfg.prompts_per_micro, cfg.obs_dim, generator=gen)
            with torch.no_grad():
                probs = policy(obs).exp()
                actions = torch.multinomial(probs, G, replacement=True, generator=gen)  # P x G
                rewards = reward_fn(obs, actions, w_true)
                baseline = (rewards.sum(-1, keepdim=True) - rewards) / (G - 1)
                adv = rewards - baseline
                ref_logp = ref(obs).gather(-1, actions)
            logp_all = policy(obs)
            logp = logp_all.gather(-1, actions)
            kl = (logp - ref_logp)
            per_sample = -(adv * logp) + cfg.kl_coef * kl
            loss = per_sample.mean() / cfg.grad_accum
            sync.enabled = micro == cfg.grad_accum - 1
            loss.backward()
        sync.finalize()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()

    if rank == 0:
        model = policy
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = RLOOConfig(port=int(sys.argv[1]) if len(sys.argv) > 1 else 49231)
    mp.spawn(run, args=(2, cfg), nprocs=2, join=True)
