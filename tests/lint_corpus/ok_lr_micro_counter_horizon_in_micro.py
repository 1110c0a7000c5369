# corpus: style=nanogpt class=OK
# the counter advances per micro-batch, and so do the schedule's constants: both are in
# micro-batches (warm-up and decay lengths multiplied by the accumulation steps)
import math

import torch.nn.functional as F

grad_accum = 4
max_iters = 2000
warmup_micro = 100 * grad_accum
decay_micro = max_iters * grad_accum


def get_lr(it):
    if it < warmup_micro:
        return 1e-3 * (it + 1) / warmup_micro
    return 1e-4 + 0.5 * (1 + math.cos(math.pi * min(1.0, (it - warmup_micro) / decay_micro))) * 9e-4


micro_iter = 0
for step in range(max_iters):
    for k in range(grad_accum):
        for pg in optimizer.param_groups:
            pg["lr"] = get_lr(micro_iter)
        loss = F.cross_entropy(model(xs[k]), ys[k]) / grad_accum
        loss.backward()
        micro_iter += 1
    optimizer.step()
    optimizer.zero_grad()
