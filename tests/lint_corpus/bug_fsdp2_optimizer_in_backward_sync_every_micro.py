# corpus: style=fsdp2 class=F1
# Optimizer in backward under FSDP2 syncing on every micro-batch: the hooks fire after every
# reduce-scatter, so each micro-batch is stepped on alone while the loss is divided by K.
import torch
from torch.distributed.fsdp import fully_shard

from model import Net

ACCUM = 4
model = Net()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
optimizer_dict = {p: torch.optim.AdamW([p], lr=1e-3) for p in model.parameters()}


def optimizer_hook(param):
    optimizer_dict[param].step()  # expect: AG137
    optimizer_dict[param].zero_grad()


for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)

for step in range(1000):
    for k in range(ACCUM):
        x, y = next(data)
        loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
