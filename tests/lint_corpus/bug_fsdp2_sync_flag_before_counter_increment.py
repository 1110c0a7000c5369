# corpus: style=fsdp2 class=F11
# a small accumulator object: the sync flag is computed from the counter before it is
# incremented (true on the window's first micro-step), the step decision it returns after
# (true on its last): the stepping micro-step is never reduce-scattered
import torch
from torch.distributed.fsdp import fully_shard


class Accum:
    def __init__(self, model, k):
        self.model, self.k, self.count = model, k, 0

    def backward(self, loss):
        sync_now = self.count % self.k == 0
        self.model.set_requires_gradient_sync(sync_now)  # expect: AG111
        (loss / self.k).backward()
        self.count += 1
        return self.count % self.k == 0


def train(model, loader, k=4):
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    acc = Accum(model, k)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if acc.backward(loss):
            opt.step()
            opt.zero_grad()
