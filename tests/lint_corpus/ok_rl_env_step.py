# corpus: style=rl class=OK
# RL: env.step() is not an optimizer step; no accumulation in sight
import torch

for episode in range(100):
    obs = env.reset()
    done = False
    while not done:
        action = policy(obs)
        obs, reward, done, info = env.step(action)
        loss = -reward * policy.log_prob(action)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
