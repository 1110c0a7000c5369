# corpus: style=rl class=OK
# PPO update: several epochs over minibatches, one step per minibatch (K = 1).
import torch

for update in range(num_updates):
    obs, actions, returns, advantages = collect_rollout(env, policy, n_steps)
    for epoch in range(ppo_epochs):
        for idx in minibatch_indices(len(obs), minibatch_size):
            new_logp, entropy, value = policy.evaluate(obs[idx], actions[idx])
            ratio = (new_logp - old_logp[idx]).exp()
            pg_loss = -torch.min(ratio * advantages[idx], ratio.clamp(0.8, 1.2) * advantages[idx]).mean()
            loss = pg_loss + 0.5 * (returns[idx] - value).pow(2).mean() - 0.01 * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            optimizer.step()
