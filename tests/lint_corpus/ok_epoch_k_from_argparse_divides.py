# corpus: style=argparse class=OK
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return model, ds


def train(epochs=2, accum=3, lr=0.1):
    model, ds = build()
    loader = DataLoader(ds, batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            (nn.functional.cross_entropy(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()
    train(accum=args.accum)
