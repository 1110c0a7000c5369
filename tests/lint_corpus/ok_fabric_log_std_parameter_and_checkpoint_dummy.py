# corpus: style=fabric class=OK
# log_std registered as a parameter; a checkpointing dummy that requires a gradient is
# never stepped by any optimizer
import torch
import torch.nn as nn
from lightning_fabric import Fabric


class Policy(nn.Module):
    def __init__(self, obs, act):
        super().__init__()
        self.mu = nn.Linear(obs, act)
        self.log_std = nn.Parameter(torch.full((act,), -0.5))
        self.dummy = torch.ones(1, requires_grad=True)

    def forward(self, x):
        return torch.distributions.Normal(self.mu(x), self.log_std.exp())


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
net = Policy(8, 2)
opt = torch.optim.Adam(net.parameters(), lr=3e-4)
policy, opt = fabric.setup(net, opt)
for i, (obs, act, adv) in enumerate(loader):
    with fabric.no_backward_sync(policy, enabled=(i + 1) % 4 != 0):
        loss = -(policy(obs).log_prob(act).sum(-1) * adv).mean() / 4
        fabric.backward(loss)
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
