# corpus: style=rl class=OK
# DQN: the network is trained every train_freq environment steps, from t = 0 on; each
# update computes its own gradient inside the guarded block.
import torch

optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-4)
obs = env.reset()
for t in range(total_timesteps):
    action = policy(obs, t)
    obs, reward, done, info = env.step(action)
    buffer.add(obs, reward, done)
    if t > learning_starts and t % train_freq == 0:
        batch = buffer.sample(256)
        loss = td_loss(q_net, target_net, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
