# corpus: style=plain class=OK
# a critic (value head) with its own optimizer steps on every micro-batch, by design; the
# policy accumulates K micro-batches and steps once per window: the critic's step is not F1
import torch

K = 4
policy = torch.nn.Linear(32, 8)
critic = torch.nn.Linear(32, 1)
policy_opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)

for step, (obs, actions, returns) in enumerate(loader):
    values = critic(obs).squeeze(-1)
    value_loss = torch.nn.functional.mse_loss(values, returns)
    critic_opt.zero_grad()
    value_loss.backward()
    critic_opt.step()

    advantages = (returns - values.detach())
    logp = torch.log_softmax(policy(obs), -1).gather(1, actions[:, None]).squeeze(1)
    policy_loss = -(logp * advantages).mean() / K
    policy_loss.backward()
    if (step + 1) % K == 0:
        policy_opt.step()
        policy_opt.zero_grad()
