# corpus: style=hand_reduce class=F10
# overlapped communication by hand: each parameter's .grad is summed over the ranks as soon as
# backward has accumulated into it; with K backwards per step, the running sum is summed again
import torch
import torch.distributed as dist

ACCUM = 4


def reduce_grad(param):
    dist.all_reduce(param.grad)  # expect: AG154


for p in model.parameters():
    p.register_post_accumulate_grad_hook(reduce_grad)

for step in range(steps):
    for k in range(ACCUM):
        loss = torch.nn.functional.cross_entropy(model(x[step, k]), y[step, k]) / ACCUM
        loss.backward()
    for p in model.parameters():
        p.grad /= dist.get_world_size()
    opt.step()
    opt.zero_grad()
