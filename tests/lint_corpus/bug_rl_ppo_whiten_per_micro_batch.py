# corpus: style=plain class=MICRO_STAT
# PPO with K micro-batches per update: the advantages of each micro-batch are whitened by
# that micro-batch's own mean and spread, where the large batch whitens the window's
import torch


def whiten(values, eps=1e-8):
    mean, var = values.mean(), values.var()
    return (values - mean) * torch.rsqrt(var + eps)


def ppo_update(policy, opt, rollout, accum_steps=4, micro_size=8, clip=0.2):
    opt.zero_grad()
    n = rollout["mask"].sum()
    for k in range(accum_steps):
        sl = slice(k * micro_size, (k + 1) * micro_size)
        adv = rollout["advantages"][sl]
        adv = whiten(adv)  # expect: AG147
        logp = policy(rollout["obs"][sl]).log_prob(rollout["actions"][sl])
        ratio = (logp - rollout["logp_old"][sl]).exp()
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
        loss = (pg * rollout["mask"][sl]).sum() / n
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
