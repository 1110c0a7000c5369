# corpus: style=epochs class=OK
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

GRAD_ACCUM_STEPS = 5


def run(model, loader, optimizer, *, epochs, k=2):
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            F.mse_loss(model(x), y).div(k).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()
        print("epoch", epoch, "done")


def main():
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(83, 16), torch.randn(83, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
    run(model, loader, optimizer, epochs=5, k=GRAD_ACCUM_STEPS)


if __name__ == "__main__":
    main()
