# corpus: style=rl_ppo class=LOSS_SCALE
# a PPO update over K minibatches under no_sync: the entropy bonus is subtracted after the
# division by K, behind a test of its coefficient, so it weighs K times its coefficient
from contextlib import nullcontext

import torch


def ppo_terms(model, mb, clip_eps):
    logits, values = model(mb["obs"])
    dist = torch.distributions.Categorical(logits=logits)
    ratio = (dist.log_prob(mb["act"]) - mb["old_logp"]).exp()
    pg = -torch.min(ratio * mb["adv"], ratio.clamp(1 - clip_eps, 1 + clip_eps) * mb["adv"]).mean()
    return pg, 0.5 * (values - mb["ret"]).pow(2).mean(), dist.entropy().mean()


class Learner:
    def __init__(self, model, args):
        self.model, self.args = model, args
        self.grad_accum_steps = args.grad_accum_steps
        self.ent_coef = args.ent_coef
        self.opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def update(self, minibatches):
        for i, mb in enumerate(minibatches):
            last = i == self.grad_accum_steps - 1
            with nullcontext() if last else self.model.no_sync():
                pg, v, ent = ppo_terms(self.model, mb, 0.2)
                loss = (pg + self.args.vf_coef * v) / self.grad_accum_steps
                if self.ent_coef > 0:
                    loss = loss - self.ent_coef * ent  # expect: AG127
                loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
