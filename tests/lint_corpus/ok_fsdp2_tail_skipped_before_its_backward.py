# corpus: style=fsdp2 class=OK
"""The fixed twin of bug_fsdp2_tail_discarded_after_unsynced_loop: the leftover is skipped
before its forward, so no unreduced gradient is left behind; the zero_grad after the loop is
only a precaution."""
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
        full = len(self.loader) - len(self.loader) % K
        for i, batch in enumerate(self.loader):
            if i >= full:
                break
            boundary = (i + 1) % K == 0
            self.micro_step(batch, sync=boundary)
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        self.opt.zero_grad(set_to_none=True)
