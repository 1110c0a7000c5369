# corpus: style=hand_allreduce class=F10
import torch
import torch.distributed as dist
import torch.nn.functional as F

grad_accum = 8


def average_grads(net, world):
    for p in net.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(world)


def train(net, batches, steps):
    world = dist.get_world_size()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        group = batches[step * grad_accum:(step + 1) * grad_accum]
        n_tgt = torch.tensor(float(sum(int((y != -1).sum()) for _, y in group)))
        dist.all_reduce(n_tgt, op=dist.ReduceOp.SUM)
        for x, y in group:
            out = net(x)
            s = F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum")
            loss = s / n_tgt  # expect: AG123
            loss.backward()
        average_grads(net, world)
        opt.step()
        opt.zero_grad(set_to_none=True)
