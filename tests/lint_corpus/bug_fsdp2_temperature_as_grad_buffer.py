# corpus: style=fsdp2 class=F10
# FSDP2 refuses a 0-d parameter, so the learned temperature became a buffer that requires a
# gradient, handed to its own optimizer: FSDP2 reduce-scatters parameters' gradients only
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class TinyLM(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.body = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("log_scale", torch.zeros((), requires_grad=True))  # expect: AG357

    def temperature_params(self):
        return [self.log_scale]

    def forward(self, x):
        return self.head(self.body(x)) * self.log_scale.exp()


model = TinyLM(64, 100)
fully_shard(model)
opts = [torch.optim.AdamW(model.parameters(), lr=1e-3),
        torch.optim.SGD(model.temperature_params(), lr=1e-2)]
for i, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        for o in opts:
            o.step()
            o.zero_grad()
