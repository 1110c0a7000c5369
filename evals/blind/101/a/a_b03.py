"""Offline actor-critic (advantage-weighted behaviour cloning) with Accelerate.

Two networks, two optimizers, one Accelerator with gradient accumulation.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed

STATE_DIM, N_ACTIONS = 12, 4
MICRO_BS, GRAD_ACCUM, EPOCHS = 8, 4, 2
N_TRANSITIONS = 256


def make_dataset():
    g = torch.Generator().manual_seed(11)
    s = torch.randn(N_TRANSITIONS, STATE_DIM, generator=g)
    w = torch.randn(STATE_DIM, N_ACTIONS, generator=g)
    a = (s @ w + 0.5 * torch.randn(N_TRANSITIONS, N_ACTIONS, generator=g)).argmax(-1)
    r = (s[:, :3].sum(-1) + 0.3 * torch.randn(N_TRANSITIONS, generator=g)).float()
    return TensorDataset(s, a, r)


def mlp(out):
    return nn.Sequential(nn.Linear(STATE_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, out))


class AWRLearner:
    def __init__(self, accelerator, beta=1.0):
        self.accelerator = accelerator
        self.beta = beta
        policy, value = mlp(N_ACTIONS), mlp(1)
        popt = torch.optim.Adam(policy.parameters(), lr=2e-3)
        vopt = torch.optim.Adam(value.parameters(), lr=5e-3)
        loader = DataLoader(make_dataset(), batch_size=MICRO_BS, shuffle=True)
        (self.policy, self.value, self.policy_opt, self.value_opt, self.loader) = accelerator.prepare(
            policy, value, popt, vopt, loader)

    def policy_loss(self, s, a, r):
        with torch.no_grad():
            adv = r - self.value(s).squeeze(-1)
            w = torch.exp(adv / self.beta).clamp(max=20.0)
        logp = F.log_softmax(self.policy(s), -1).gather(1, a[:, None]).squeeze(1)
        return -(w * logp).mean()

    def value_loss(self, s, r):
        return F.mse_loss(self.value(s).squeeze(-1), r)

    def train_step(self, batch):
        s, a, r = batch
        with self.accelerator.accumulate(self.policy):
            self.accelerator.backward(self.policy_loss(s, a, r))
            self.policy_opt.step()
            self.policy_opt.zero_grad()
        with self.accelerator.accumulate(self.value):
            self.accelerator.backward(self.value_loss(s, r))
            self.value_opt.step()
            self.value_opt.zero_grad()

    def fit(self, epochs):
        for _ in range(epochs):
            for batch in self.loader:
                self.train_step(batch)


def final_sha(modules):
    h = hashlib.sha256()
    for m in modules:
        for _, p in m.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM, cpu=True)
    learner = AWRLearner(accelerator)
    learner.fit(EPOCHS)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        final = nn.ModuleDict({"policy": accelerator.unwrap_model(learner.policy),
                               "value": accelerator.unwrap_model(learner.value)})
        print(f"FINAL_SHA256 {final_sha([final])}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
