# corpus: style=nanogpt class=F4
# nanoGPT loop converted to accumulation by wrapping the body in a micro-step loop: the
# iteration counter now advances per micro-batch, the schedule's constants are optimizer steps
import math

import torch
import torch.nn.functional as F

gradient_accumulation_steps = 8
learning_rate, min_lr = 6e-4, 6e-5
warmup_iters, lr_decay_iters, max_iters = 200, 5000, 5000


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


iter_num = 0
step = 0
while step < max_iters:
    for micro_step in range(gradient_accumulation_steps):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr  # expect: AG130
        X, Y = get_batch("train")
        loss = F.cross_entropy(model(X).view(-1, 50304), Y.view(-1)) / gradient_accumulation_steps
        loss.backward()
        iter_num += 1
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
