# corpus: style=rl_policy_gradient class=F5
# a policy-gradient loss helper returns the masked token mean of this micro-batch's
# responses (lengths vary); the loop divides it by K: a mean of means
import torch
import torch.nn.functional as F


def pg_loss(logits, actions, advantages, mask):
    logp = F.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    per_token = -logp * advantages
    return (per_token * mask).sum() / mask.sum()


grad_accum = 8
opt = torch.optim.Adam(policy.parameters(), lr=1e-5)
for it, rollout in enumerate(rollouts):
    logits = policy(rollout.input_ids)
    loss = pg_loss(logits, rollout.actions, rollout.advantages, rollout.response_mask)
    (loss / grad_accum).backward()  # expect: AG104
    if (it + 1) % grad_accum == 0:
        opt.step()
        opt.zero_grad()
