# corpus: style=fabric class=F10
# a Gaussian policy's log_std kept as a plain tensor that requires a gradient, added to the
# optimizer by hand: Fabric's DDP averages registered parameters only
import torch
import torch.nn as nn
from lightning_fabric import Fabric


class Policy(nn.Module):
    def __init__(self, obs, act):
        super().__init__()
        self.mu = nn.Linear(obs, act)
        self.log_std = torch.full((act,), -0.5, requires_grad=True)  # expect: AG357

    def forward(self, x):
        return torch.distributions.Normal(self.mu(x), self.log_std.exp())


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
net = Policy(8, 2)
opt = torch.optim.Adam(list(net.parameters()) + [net.log_std], lr=3e-4)
policy, opt = fabric.setup(net, opt)
for i, (obs, act, adv) in enumerate(loader):
    with fabric.no_backward_sync(policy, enabled=(i + 1) % 4 != 0):
        loss = -(policy(obs).log_prob(act).sum(-1) * adv).mean() / 4
        fabric.backward(loss)
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
