"""Accelerate: a feature encoder + policy head trained jointly with a separate value network.

Only the policy goes into `accelerator.accumulate(...)`; the value network is prepared too and
its optimizer is an AcceleratedOptimizer, so it also only steps on sync steps (its DDP
all-reduces on every micro-step, which is just extra communication).
"""
import hashlib
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

SEED, OBS, ACT, K, MB, EPOCHS = 3, 12, 4, 3, 4, 2


def make_data():
    g = torch.Generator().manual_seed(SEED)
    obs = torch.randn(144, OBS, generator=g)
    act = torch.randint(0, ACT, (144,), generator=g)
    ret = obs[:, :3].sum(-1) + 0.3 * torch.randn(144, generator=g)
    adv = torch.randn(144, generator=g)
    return TensorDataset(obs, act, ret, adv)


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert acc.num_processes == 2
    set_seed(SEED)
    policy = nn.Sequential(nn.Linear(OBS, 32), nn.Tanh(), nn.Linear(32, ACT))
    value = nn.Sequential(nn.Linear(OBS, 32), nn.Tanh(), nn.Linear(32, 1))
    opt_pi = torch.optim.Adam(policy.parameters(), lr=3e-3)
    opt_v = torch.optim.SGD(value.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(make_data(), batch_size=MB, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    policy, value, opt_pi, opt_v, loader = acc.prepare(policy, value, opt_pi, opt_v, loader)

    for _ in range(EPOCHS):
        for obs, act, ret, adv in loader:
            with acc.accumulate(policy):
                logp = F.log_softmax(policy(obs), -1).gather(1, act[:, None]).squeeze(1)
                pg_loss = -(logp * adv).mean()
                v_loss = F.mse_loss(value(obs).squeeze(-1), ret)
                acc.backward(pg_loss + 0.5 * v_loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(policy.parameters(), 0.2)
                    acc.clip_grad_norm_(value.parameters(), 0.5)
                opt_pi.step()
                opt_v.step()
                opt_pi.zero_grad()
                opt_v.zero_grad()

    parts = []
    for m in (policy, value):
        parts += [p.detach().float().reshape(-1) for _, p in acc.unwrap_model(m).named_parameters()]
    flat = torch.cat(parts)
    if acc.is_main_process:
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
