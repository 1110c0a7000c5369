# corpus: style=closures class=F1
import torch
import torch.nn.functional as F

grad_accum = 4


def run_epoch(fn, loader):
    for batch in loader:
        fn(batch)


def main(model, loader):
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)

    def step_fn(batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y) / grad_accum
        loss.backward()
        opt.step()  # expect: AG101
        opt.zero_grad()

    for _ in range(3):
        run_epoch(step_fn, loader)
