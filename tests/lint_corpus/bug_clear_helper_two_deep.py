# corpus: style=plain class=F3
import torch
import torch.nn.functional as F

ACCUM = 4


def _clear(model):
    model.zero_grad(set_to_none=True)  # expect: AG102


def reset_state(model, stats):
    stats.clear()
    _clear(model)


def train(model, loader, epochs=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = {}
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            reset_state(model, stats)
            loss = F.cross_entropy(model(x), y) / ACCUM
            loss.backward()
            if (i + 1) % ACCUM == 0:  # expect: AG117
                opt.step()
