# corpus: style=fsdp2 class=LOSS_SCALE
"""FSDP2 units divide the ranks' summed gradient by K x W (a config property), and the loss
is divided by K too: divided by K twice (blind round 122 a_b03)."""
from dataclasses import dataclass

import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    world_size: int = 2
    accum_steps: int = 4

    @property
    def grad_divide_factor(self) -> float:
        return float(self.world_size * self.accum_steps)


def train(model, loader, opt, cfg):
    for m in model.blocks:
        fully_shard(m)
    fully_shard(model)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(cfg.grad_divide_factor)  # expect: AG345
    for i, (x, y) in enumerate(loader):
        model.set_requires_gradient_sync((i + 1) % cfg.accum_steps == 0)
        loss = F.cross_entropy(model(x), y) / cfg.accum_steps
        loss.backward()
        if (i + 1) % cfg.accum_steps == 0:
            opt.step()
            opt.zero_grad()
