# corpus: style=rl class=OK
for update in range(num_updates):
    values, log_probs, rewards, entropies = [], [], [], []
    for t in range(n_steps):
        dist_a, value = policy(obs)
        action = dist_a.sample()
        obs, reward, done, _ = env.step(action)
        values.append(value)
        log_probs.append(dist_a.log_prob(action))
        rewards.append(reward)
        entropies.append(dist_a.entropy())
    returns = compute_returns(rewards, gamma)
    advantage = returns - torch.stack(values)
    loss = -(torch.stack(log_probs) * advantage.detach()).mean() + 0.5 * advantage.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
