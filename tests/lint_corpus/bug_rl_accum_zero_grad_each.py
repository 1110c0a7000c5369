# corpus: style=rl class=F3
grad_accum_episodes = 8
for ep in range(num_episodes):
    log_probs, rewards = run_episode(env, policy)
    returns = discount(rewards, gamma)
    policy_loss = -(torch.stack(log_probs) * returns).sum() / grad_accum_episodes
    optimizer.zero_grad()  # expect: AG102
    policy_loss.backward()
    if (ep + 1) % grad_accum_episodes == 0:
        optimizer.step()
