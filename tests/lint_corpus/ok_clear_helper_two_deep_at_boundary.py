# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

ACCUM = 4


def _clear(model):
    model.zero_grad(set_to_none=True)


def finish_window(model, opt, stats):
    opt.step()
    stats.clear()
    _clear(model)


def train(model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = {}
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            finish_window(model, opt, stats)
