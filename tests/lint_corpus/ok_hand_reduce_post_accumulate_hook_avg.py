# corpus: style=hand_reduce class=OK
# the same overlap with ReduceOp.AVG: the running sum is identical on every rank after each
# reduction, so averaging it again at the next backward changes nothing
import torch
import torch.distributed as dist

ACCUM = 4


def reduce_grad(param):
    dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)


for p in model.parameters():
    p.register_post_accumulate_grad_hook(reduce_grad)

for step in range(steps):
    for k in range(ACCUM):
        loss = torch.nn.functional.cross_entropy(model(x[step, k]), y[step, k]) / ACCUM
        loss.backward()
    opt.step()
    opt.zero_grad()
