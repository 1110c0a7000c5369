# corpus: style=plain class=OK
# GRPO over precomputed rollouts: each micro-step takes one prompt's group of completions by
# slicing, and normalises within the group on purpose
import torch


def grpo_update(policy, opt, batch, n_groups, group_size=4):
    opt.zero_grad()
    for g in range(n_groups):
        group = slice(g * group_size, (g + 1) * group_size)
        group_rewards = batch["rewards"][group]
        adv = (group_rewards - group_rewards.mean()) / (group_rewards.std() + 1e-6)
        logps = policy(batch["ids"][group]).sum(-1)
        loss = -(adv * logps).mean() / n_groups
        loss.backward()
    opt.step()
