# corpus: style=fsdp2 class=OK
# Optimizer in backward under FSDP2, the sync deferred to each window's last micro-batch: the
# hooks of FSDP2's sharded parameters fire when the reduce-scatter writes their gradient, so
# each parameter's optimizer steps once per window on the window's whole gradient.
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
    optimizer_dict[param].step()
    optimizer_dict[param].zero_grad()


for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)

for step in range(1000):
    for k in range(ACCUM):
        model.set_requires_gradient_sync(k == ACCUM - 1)
        x, y = next(data)
        loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
