# corpus: style=fsdp2 class=OK
# the learned temperature as a one-element parameter: FSDP2 shards and reduces it
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class TinyLM(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.body = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)
        self.log_scale = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.head(self.body(x)) * self.log_scale.exp()


model = TinyLM(64, 100)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
