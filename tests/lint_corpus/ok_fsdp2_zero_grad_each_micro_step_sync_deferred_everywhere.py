# corpus: style=class_trainer class=OK
# FSDP2 defers every unit's sync (recurse=True) on the micro-steps before the last: the
# gradient stays on the unsharded parameters, so the clear before each backward finds an
# empty sharded .grad and the synced backward writes the window's sum after it
import torch
from torch.distributed.fsdp import fully_shard


class ShardedTrainer:
    def __init__(self, model, k):
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        self.model, self.k = model, k
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def set_sync(self, on):
        self.model.set_requires_gradient_sync(on, recurse=True)

    def micro_step(self, i, x, y):
        self.opt.zero_grad(set_to_none=True)
        self.set_sync(i == self.k - 1)
        loss = torch.nn.functional.mse_loss(self.model(x), y) / self.k
        loss.backward()

    def fit(self, windows):
        for window in windows:
            for i, (x, y) in enumerate(window):
                self.micro_step(i, x, y)
            self.opt.step()
