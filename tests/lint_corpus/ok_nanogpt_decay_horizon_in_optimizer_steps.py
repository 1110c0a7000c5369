# corpus: style=nanogpt class=OK
# the same loop with the horizon in optimizer steps
import math

import torch

grad_accum, epochs, warmup_iters, max_lr = 4, 3, 10, 6e-4
loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
lr_decay_iters = epochs * (len(loader) // grad_accum)


def get_lr(it, decay_iters):
    if it < warmup_iters:
        return max_lr * (it + 1) / warmup_iters
    ratio = min(1.0, (it - warmup_iters) / (decay_iters - warmup_iters))
    return max_lr * 0.5 * (1.0 + math.cos(math.pi * ratio))


iter_num = 0
for epoch in range(epochs):
    data_iter = iter(loader)
    for _ in range(len(loader) // grad_accum):
        lr = get_lr(iter_num, lr_decay_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(grad_accum):
            x, y = next(data_iter)
            loss = model(x, y) / grad_accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
