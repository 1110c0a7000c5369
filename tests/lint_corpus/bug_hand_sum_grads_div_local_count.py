# corpus: style=hand_allreduce class=F10
# Summed losses, gradients summed over the ranks, then divided in place by the number of
# samples this rank saw: W times the large-batch mean.
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
                    dist.all_reduce(p.grad)  # expect: AG107
                    p.grad.div_(seen)
            opt.step()
            opt.zero_grad()
            seen = 0
