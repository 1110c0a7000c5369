# corpus: style=plain class=OK
# PPO with K micro-batches per update: the window's advantages are whitened once, inline,
# before the micro-batch loop, and each micro-batch takes its slice
import torch


def ppo_update(policy, opt, rollout, accum_steps=4, micro_size=8, clip=0.2):
    opt.zero_grad()
    n = rollout["mask"].sum()
    advantages = rollout["advantages"]
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    for k in range(accum_steps):
        sl = slice(k * micro_size, (k + 1) * micro_size)
        adv = advantages[sl]
        logp = policy(rollout["obs"][sl]).log_prob(rollout["actions"][sl])
        ratio = (logp - rollout["logp_old"][sl]).exp()
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
        loss = (pg * rollout["mask"][sl]).sum() / n
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
