# corpus: style=rl class=F1
# the critic's loss is divided by accum_steps (meant to accumulate) but the critic steps on
# every chunk with its own zero_grad: K small steps
import torch

accum_steps = 4
actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
for step, (obs, act, ret) in enumerate(rollouts):
    value = critic(obs).squeeze(-1)
    critic_loss = (ret - value).pow(2).mean() / accum_steps
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()  # expect: AG101
    adv = (ret - value).detach()
    actor_loss = -(actor(obs).log_prob(act) * adv).mean() / accum_steps
    actor_loss.backward()
    if (step + 1) % accum_steps == 0:
        actor_opt.step()
        actor_opt.zero_grad()
