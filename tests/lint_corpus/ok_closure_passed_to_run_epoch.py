# corpus: style=closures class=OK
import torch
import torch.nn.functional as F

grad_accum = 4


def run_epoch(fn, loader):
    for i, batch in enumerate(loader):
        fn(i, batch)


def main(model, loader):
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)

    def step_fn(i, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y) / grad_accum
        loss.backward()
        if (i + 1) % grad_accum == 0:
            opt.step()
            opt.zero_grad()

    for _ in range(3):
        run_epoch(step_fn, loader)
