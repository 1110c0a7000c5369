# corpus: style=nanogpt class=OK
# nanoGPT's own loop: the learning rate is set once per optimizer step from iter_num, which is
# incremented after the step, outside the micro-step loop
import math

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
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch("train")
        loss = F.cross_entropy(model(X).view(-1, 50304), Y.view(-1)) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > max_iters:
        break
