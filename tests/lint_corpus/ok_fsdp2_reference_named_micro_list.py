# corpus: style=fsdp2 class=OK
# the large-batch reference gathers each window's micro-batches of every rank into a list
# named `micro` and takes one step per window on their concatenation
import torch


def reference(model, data, steps, lr, token_loss_sum):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        micro = [mb for r in data[step] for mb in r]
        ids = torch.cat([m[0] for m in micro])
        labels = torch.cat([m[1] for m in micro])
        loss = token_loss_sum(model, ids, labels) / (labels != -100).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
