# corpus: style=epochs class=F7
# a per-epoch function over a list of 10 micro-batches with K = 3: one micro-batch left per epoch
import torch

K = 3
samples = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(10)]


def run_epoch(net, opt):
    for n, (x, y) in enumerate(samples, 1):
        loss = torch.nn.functional.mse_loss(net(x), y) / K
        loss.backward()
        if n % K == 0:  # expect: AG117
            opt.step()
            opt.zero_grad()


for _ in range(5):
    run_epoch(net, optimizer)
