# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

GRAD_ACCUM_STEPS = 4
MICRO_BATCH_SIZE = 16


def summed_then_mean(model, x, y):
    loss = F.mse_loss(model(x), y, reduction="sum")
    return loss / MICRO_BATCH_SIZE


def main():
    model = torch.nn.Linear(10, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [(torch.randn(MICRO_BATCH_SIZE, 10), torch.randn(MICRO_BATCH_SIZE, 1)) for _ in range(32)]
    for i, (x, y) in enumerate(data):
        loss = summed_then_mean(model, x, y)
        (loss / GRAD_ACCUM_STEPS).backward()
        if (i + 1) % GRAD_ACCUM_STEPS == 0:
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    main()
