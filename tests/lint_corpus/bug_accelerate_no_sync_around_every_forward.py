# corpus: style=accelerate class=F11
# every forward runs under accelerator.no_sync and the boundary's backward is written
# outside it, expecting that backward to reduce: DDP decided at the forward, so it never does
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
            acc.backward(loss)  # expect: AG111
            opt.step()
            opt.zero_grad()
