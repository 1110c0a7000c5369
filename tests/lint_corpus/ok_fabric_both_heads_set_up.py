# corpus: style=fabric class=OK
"""A Fabric actor-critic that sets up both the policy and the value network (one optimizer
over both): Fabric averages both modules' gradients."""
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
value = fabric.setup_module(agent.value)
optimizer = fabric.setup_optimizers(optimizer)
print(agent.hidden)
for obs in batches:
    loss = policy(obs).logsumexp(-1).mean() + value(obs).pow(2).mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
