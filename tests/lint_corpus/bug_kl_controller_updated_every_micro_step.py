# corpus: style=rl_loop class=F4
# an adaptive KL controller updated after every micro-batch: the coefficient changes inside
# the window and moves K times per optimizer step
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
    for micro in range(K):
        logp, ref_logp, adv = rollout(step, micro)
        kl = (logp - ref_logp).sum(-1).mean()
        loss = -(adv * logp.sum(-1)).mean() + ctl.value * kl
        (loss / K).backward()
        ctl.update(kl.item(), n_steps=BATCH)  # expect: AG330
    opt.step()
    opt.zero_grad()
