# corpus: style=rl_policy_gradient class=OK
# the helper returns the masked token sum; the loop divides it by the window's response
# tokens, counted before the inner loop: the window's token mean
import torch
import torch.nn.functional as F


def pg_loss_sum(logits, actions, advantages, mask):
    logp = F.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return (-logp * advantages * mask).sum()


grad_accum = 8
opt = torch.optim.Adam(policy.parameters(), lr=1e-5)
for step in range(num_steps):
    window = [next(rollout_iter) for _ in range(grad_accum)]
    window_tokens = sum(r.response_mask.sum() for r in window)
    for rollout in window:
        logits = policy(rollout.input_ids)
        loss = pg_loss_sum(logits, rollout.actions, rollout.advantages, rollout.response_mask)
        (loss / window_tokens).backward()
    opt.step()
    opt.zero_grad()
