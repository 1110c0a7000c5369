# corpus: style=epochs class=F7
import torch
import torch.nn.functional as F

GRAD_ACCUM_STEPS = 4


def run(model, batches, optimizer, *, epochs, k=2):
    for epoch in range(epochs):
        micro = 0
        for x, y in batches:
            F.mse_loss(model(x), y).div(k).backward()
            micro += 1
            if micro % k == 0:  # expect: AG117
                optimizer.step()
                optimizer.zero_grad()
        print("epoch", epoch, "done")


def main():
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(10)]
    run(model, batches, optimizer, epochs=5, k=GRAD_ACCUM_STEPS)


if __name__ == "__main__":
    main()
