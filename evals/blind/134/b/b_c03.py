"""Offline advantage-weighted actor-critic with Accelerate: a policy and a value network,
two optimizers and two prepared warm-up schedules, bf16 autocast, both models under one
`accumulate(policy, value)` block, K = 2."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


@dataclass
class AWRConfig:
    seed: int = 2024
    obs_dim: int = 8
    n_actions: int = 5
    n_samples: int = 64
    micro: int = 4
    grad_accum: int = 2
    epochs: int = 3
    pi_lr: float = 3e-3
    v_lr: float = 1e-2
    beta: float = 1.0
    warmup: int = 3
    clip: float = 0.5


class Policy(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(c.obs_dim, 32), nn.Tanh(), nn.Linear(32, c.n_actions))

    def forward(self, obs):
        return self.net(obs)


class Value(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(c.obs_dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


def offline_data(c):
    g = torch.Generator().manual_seed(c.seed + 9)
    obs = torch.randn(c.n_samples, c.obs_dim, generator=g)
    act = torch.randint(0, c.n_actions, (c.n_samples,), generator=g)
    ret = obs[:, 0] - 0.5 * obs[:, 1] + 0.1 * act.float() + 0.2 * torch.randn(c.n_samples, generator=g)
    return TensorDataset(obs, act, ret)


def warmup_lambda(total):
    return lambda s: min(1.0, (s + 1) / total)


def main():
    c = AWRConfig()
    torch.use_deterministic_algorithms(True)
    acc = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=c.grad_accum)
    assert acc.num_processes == 2
    torch.manual_seed(c.seed)
    policy, value = Policy(c), Value(c)
    pi_opt = torch.optim.Adam(policy.parameters(), lr=c.pi_lr)
    v_opt = torch.optim.SGD(value.parameters(), lr=c.v_lr, momentum=0.9)
    # prepared schedulers advance num_processes times per optimizer step
    pi_sched = torch.optim.lr_scheduler.LambdaLR(pi_opt, warmup_lambda(c.warmup * acc.num_processes))
    v_sched = torch.optim.lr_scheduler.LambdaLR(v_opt, warmup_lambda(c.warmup * acc.num_processes))
    loader = DataLoader(offline_data(c), batch_size=c.micro, shuffle=True,
                        generator=torch.Generator().manual_seed(c.seed))
    policy, value, pi_opt, v_opt, pi_sched, v_sched, loader = acc.prepare(
        policy, value, pi_opt, v_opt, pi_sched, v_sched, loader)
    n_updates = 0
    for epoch in range(c.epochs):
        for obs, act, ret in loader:
            with acc.accumulate(policy, value):
                v = value(obs)
                adv = (ret - v).detach().float()
                w = torch.exp(adv / c.beta).clamp(max=20.0)
                logp = F.log_softmax(policy(obs).float(), -1).gather(1, act[:, None]).squeeze(1)
                pi_loss = -(w * logp).mean()
                v_loss = F.mse_loss(v.float(), ret)
                acc.backward(pi_loss + 0.5 * v_loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(policy.parameters(), c.clip)
                    acc.clip_grad_norm_(value.parameters(), c.clip)
                    n_updates += 1
                pi_opt.step()
                v_opt.step()
                pi_sched.step()
                v_sched.step()
                pi_opt.zero_grad()
                v_opt.zero_grad()
    if acc.is_main_process:
        h = hashlib.sha256()
        params = {}
        for tag, m in (("policy", acc.unwrap_model(policy)), ("value", acc.unwrap_model(value))):
            for n, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
                params[f"{tag}.{n}"] = p.detach().float().clone()
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c03")
        os.makedirs(out, exist_ok=True)
        torch.save(params, os.path.join(out, "final_params.pt"))
        print(f"updates={n_updates}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
