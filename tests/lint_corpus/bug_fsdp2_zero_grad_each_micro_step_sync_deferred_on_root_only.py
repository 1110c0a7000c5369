# corpus: style=class_trainer class=F3
# only the root unit defers its sync (recurse=False): the nested blocks reduce into the
# sharded .grad on every micro-step, and the clear before each backward erases it
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
        self.model.set_requires_gradient_sync(on, recurse=False)

    def micro_step(self, i, x, y):
        self.opt.zero_grad(set_to_none=True)  # expect: AG102
        self.set_sync(i == self.k - 1)
        loss = torch.nn.functional.mse_loss(self.model(x), y) / self.k
        loss.backward()

    def fit(self, windows):
        for window in windows:
            for i, (x, y) in enumerate(window):
                self.micro_step(i, x, y)
            self.opt.step()
