# corpus: style=plain class=OK
# GRPO written per prompt: each micro-step generates one prompt's group of completions and
# normalises their rewards within the group (the algorithm's own per-group statistic), then
# one optimizer step per batch of prompts
import torch


def grpo_step(policy, opt, prompts, reward_fn, group_size=4):
    opt.zero_grad()
    for prompt in prompts:
        completions, logps = policy.sample(prompt, n=group_size)
        rewards = reward_fn(prompt, completions)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        loss = -(adv.detach() * logps.sum(-1)).mean() / len(prompts)
        loss.backward()
    opt.step()
