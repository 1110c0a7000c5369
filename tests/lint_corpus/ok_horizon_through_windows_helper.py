# corpus: style=plain class=OK
import torch

K = 4
EPOCHS = 3


def windows_per_epoch(n_batches):
    return (n_batches + K - 1) // K


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = EPOCHS * windows_per_epoch(len(loader))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=total)
    n = len(loader)
    for _ in range(EPOCHS):
        for i, (x, y) in enumerate(loader):
            size = min(K, n - (i // K) * K)
            (torch.nn.functional.mse_loss(model(x), y) / size).backward()
            if (i + 1) % K == 0 or i + 1 == n:
                opt.step()
                sched.step()
                opt.zero_grad()
