# corpus: style=rl class=F10
import os

from torch.nn.parallel import DistributedDataParallel as DDP

policy = DDP(policy_net)
world = int(os.environ["WORLD_SIZE"])
for it in range(iters):
    batch = buffer.sample(batch_size)
    q = policy(batch.obs).gather(1, batch.act)
    td_loss = (q - batch.target).pow(2).mean()
    td_loss /= world  # expect: AG112
    td_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
