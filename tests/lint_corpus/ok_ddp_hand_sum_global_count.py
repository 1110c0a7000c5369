# corpus: style=hand_allreduce class=OK
import torch
import torch.distributed as dist
import torch.nn.functional as F

grad_accum = 8


def sum_grads(net):
    for p in net.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def train(net, batches, steps):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        group = batches[step * grad_accum:(step + 1) * grad_accum]
        n_tgt = torch.tensor(float(sum(int((y != -1).sum()) for _, y in group)))
        dist.all_reduce(n_tgt, op=dist.ReduceOp.SUM)
        for x, y in group:
            out = net(x)
            s = F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum")
            loss = s / n_tgt
            loss.backward()
        sum_grads(net)
        opt.step()
        opt.zero_grad(set_to_none=True)
