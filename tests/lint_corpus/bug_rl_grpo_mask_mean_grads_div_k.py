# corpus: style=rl class=F5 miss=the 1/K is applied to the gradients, the per-micro-batch token mean is not a division by K
# each micro-batch's masked token mean is backwarded as is and the gradients are divided by
# K before the step: the scale is right (no K x), the tokens of short micro-batches still
# weigh more than in the large batch (mean of means)
import torch

ppo_grad_accum = 4

for update, rollout in enumerate(rollouts):
    for i in range(ppo_grad_accum):
        mb = rollout.micro_batch(i)
        logp = policy(mb.ids).log_softmax(-1).gather(-1, mb.targets[..., None]).squeeze(-1)
        loss = -(mb.adv[:, None] * logp * mb.mask).sum() / mb.mask.sum()
        loss.backward()
    for p in policy.parameters():
        p.grad.div_(ppo_grad_accum)
    opt.step()
    opt.zero_grad()
