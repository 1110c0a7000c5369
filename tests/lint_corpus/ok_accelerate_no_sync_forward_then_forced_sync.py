# corpus: style=accelerate class=OK
# the same loop forcing the reduction of the boundary's backward after a forward under
# no_sync (trigger_sync_in_backward prepares DDP's reducer again)
import torch
from accelerate import Accelerator


def train(model, loader, K=4):
    acc = Accelerator(cpu=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, loader)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % K == 0
        with acc.no_sync(model):
            loss = torch.nn.functional.cross_entropy(model(x), y) / K
            if not last:
                acc.backward(loss)
        if last:
            with acc.trigger_sync_in_backward(model):
                acc.backward(loss)
            opt.step()
            opt.zero_grad()
