# corpus: style=fsdp2 class=OK
"""Like bug_fsdp2_tail_discarded_after_unsynced_loop, but the epoch's batches are cut to whole
windows before the loop, so there is no leftover; the zero_grad after the loop is only a
precaution (blind round 110 b_b02's fixed twin)."""
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
        batches = list(self.loader)
        batches = batches[: len(batches) // K * K]
        for i, batch in enumerate(batches):
            boundary = (i + 1) % K == 0
            self.micro_step(batch, sync=boundary)
            if boundary:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        self.opt.zero_grad(set_to_none=True)
