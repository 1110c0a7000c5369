# corpus: style=fsdp2 class=OK
# the sync flag looks one micro-step ahead ((count + 1) % k == 0) because the counter is
# incremented after the backward, where the step decision reads it: both name the
# window's last micro-step
import torch
from torch.distributed.fsdp import fully_shard


class Accum:
    def __init__(self, model, k):
        self.model, self.k, self.count = model, k, 0

    def backward(self, loss):
        sync_now = (self.count + 1) % self.k == 0
        self.model.set_requires_gradient_sync(sync_now)
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
