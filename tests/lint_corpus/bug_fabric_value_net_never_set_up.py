# corpus: style=fabric class=F10
"""A Fabric actor-critic that sets up the policy and only moves the value network to the
device, one optimizer over both: the value network's gradients are never averaged over the
ranks (blind round 121 c_b01)."""
import torch
from lightning.fabric import Fabric
from torch import nn


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.policy = nn.Linear(8, 4)
        self.value = nn.Linear(8, 1)
        self.hidden = 8


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
agent = Agent()
optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
policy = fabric.setup_module(agent.policy)
value = agent.value.to(fabric.device)  # expect: AG341
optimizer = fabric.setup_optimizers(optimizer)
print(agent.hidden)
for obs in batches:
    loss = policy(obs).logsumexp(-1).mean() + value(obs).pow(2).mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
