# corpus: style=fabric class=OK
"""The fixed twin of bug_fabric_submodules_in_loss_helper: the helper calls the model
fabric.setup returned, through DDP's forward (blind round 126 c_b02 fixed)."""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F


class ActorCritic(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.torso = nn.Linear(d, 32)
        self.pi = nn.Linear(32, n)

    def forward(self, x):
        return self.pi(self.torso(x))


def pg_loss(agent, obs, actions, adv):
    logits = agent(obs)
    return -(F.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1) * adv).mean()


def main(batches, k):
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    agent = ActorCritic(8, 4)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
    agent, opt = fabric.setup(agent, opt)
    for i, (obs, actions, adv) in enumerate(batches):
        with fabric.no_backward_sync(agent, enabled=(i + 1) % k != 0):
            fabric.backward(pg_loss(agent, obs, actions, adv) / k)
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
