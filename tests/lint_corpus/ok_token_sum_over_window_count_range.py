# corpus: style=rl class=OK
# the window's completion tokens are counted first: each micro-batch's token sum over them
import torch

N = 4
for step in range(num_steps):
    window = rollouts[step * N:(step + 1) * N]
    n_tokens = sum(m.sum() for _, m, _ in window)
    for j in range(N):
        ids, mask, adv = window[j]
        per_token = policy_terms(policy, ids, adv)
        ((per_token * mask).sum() / n_tokens).backward()
    optimizer.step()
    optimizer.zero_grad()
