# corpus: style=rl_loop class=OK
# the same controller updated once per optimizer step from the window's mean KL
import torch

K = 4
BATCH = 64

class AdaptiveKL:
    def __init__(self, value, target, horizon):
        self.value, self.target, self.horizon = value, target, horizon

    def update(self, current, n_steps):
        err = max(-0.2, min(0.2, current / self.target - 1))
        self.value *= 1 + err * n_steps / self.horizon

ctl = AdaptiveKL(0.2, 6.0, 10000)
opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
for step in range(100):
    window_kl = 0.0
    for micro in range(K):
        logp, ref_logp, adv = rollout(step, micro)
        kl = (logp - ref_logp).sum(-1).mean()
        loss = -(adv * logp.sum(-1)).mean() + ctl.value * kl
        (loss / K).backward()
        window_kl += kl.item() / K
    ctl.update(window_kl, n_steps=BATCH)
    opt.step()
    opt.zero_grad()
