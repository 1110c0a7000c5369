# corpus: style=hand_allreduce class=OK
# Summed losses, gradients summed over the ranks, then divided in place by the number of
# samples every rank saw in the window (a count all-reduced with SUM): the large-batch mean.
import torch
import torch.distributed as dist
import torch.nn.functional as F

ACCUM = 4


def train(model, loader, opt):
    seen = 0
    for i, (x, y) in enumerate(loader):
        loss = F.mse_loss(model(x), y, reduction="sum")
        loss.backward()
        seen += x.shape[0]
        if (i + 1) % ACCUM == 0:
            count = torch.tensor(float(seen))
            dist.all_reduce(count)
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(count)
            opt.step()
            opt.zero_grad()
            seen = 0
