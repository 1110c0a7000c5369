# corpus: style=fsdp2 class=F7
"""An FSDP2 trainer whose sync flag is true at multiples of K only, passed down to a method
that calls set_requires_gradient_sync, and that throws the epoch's leftover away with
zero_grad after the loop: FSDP2 holds the leftover's gradient unsharded, outside the .grad
zero_grad clears, and reduces it with the next window (blind round 124 a_b03)."""
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


class Trainer:
    def __init__(self, model, loader, k):
        fully_shard(model)
        self.model, self.loader, self.k = model, loader, k
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def micro_step(self, batch, sync):
        x, y = batch
        self.model.set_requires_gradient_sync(sync)
        (F.cross_entropy(self.model(x), y) / self.k).backward()

    def train_epoch(self):
        K = self.k
        for i, batch in enumerate(self.loader):
            boundary = (i + 1) % K == 0
            self.micro_step(batch, sync=boundary)
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        if len(self.loader) % K:
            self.opt.zero_grad(set_to_none=True)  # expect: AG348
