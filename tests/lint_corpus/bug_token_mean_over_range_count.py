# corpus: style=rl class=F5
# each micro-batch's loss is a masked token mean, divided by the window loop's count N:
# a mean of per-group means, groups of very different completion lengths
import torch

N = 4
for step in range(num_steps):
    for j in range(N):
        ids, mask, adv = rollouts[step * N + j]
        per_token = policy_terms(policy, ids, adv)
        group_loss = (per_token * mask).sum() / mask.sum()
        (group_loss / N).backward()  # expect: AG104
    optimizer.step()
    optimizer.zero_grad()
