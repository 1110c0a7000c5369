# corpus: style=ddp class=OK
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4


class Agent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = torch.nn.Linear(8, 4)
        self.critic = torch.nn.Linear(8, 1)

    def forward(self, obs, actions):
        logp = torch.log_softmax(self.actor(obs), -1).gather(1, actions[:, None]).squeeze(1)
        return logp, self.critic(obs).squeeze(1)


def update(agent, opt, batches):
    for k, (obs, actions, adv, ret) in enumerate(batches):
        with contextlib.nullcontext() if k == K - 1 else agent.no_sync():
            logp, value = agent(obs, actions)
            loss = -(logp * adv).mean() + 0.5 * (value - ret).pow(2).mean()
            (loss / K).backward()
    opt.step()
    opt.zero_grad()


def main(batches):
    agent = DDP(Agent())
    opt = torch.optim.Adam(agent.parameters(), lr=3e-4)
    for _ in range(10):
        update(agent, opt, batches)
