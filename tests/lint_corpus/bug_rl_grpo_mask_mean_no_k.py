# corpus: style=rl class=LOSS_SCALE
# GRPO-style update: each micro-batch's token loss is normalised by its own mask count and
# backwarded as is; nothing divides by the number of micro-batches
import torch


def grpo_update(policy, opt, rollouts, grad_accum_steps=4, mb=2):
    for k in range(grad_accum_steps):
        ids = rollouts["ids"][k * mb:(k + 1) * mb]
        adv = rollouts["adv"][k * mb:(k + 1) * mb]
        m = rollouts["mask"][k * mb:(k + 1) * mb, 1:]
        logp = torch.log_softmax(policy(ids[:, :-1]), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(adv[:, None] * logp * m).sum() / m.sum()
        loss.backward()  # expect: AG129
    opt.step()
    opt.zero_grad()
