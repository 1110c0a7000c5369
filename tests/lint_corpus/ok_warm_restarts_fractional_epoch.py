# corpus: style=plain class=OK
import torch

K = 4


def train(model, loader, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)
    iters = len(loader)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / K
            loss.backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
            # placed by the data's position: the same rate at each step as the large batch
            sched.step(epoch + i / iters)
        opt.zero_grad()
