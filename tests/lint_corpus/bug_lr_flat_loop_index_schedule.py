# corpus: style=plain class=F4
# a flat loop over micro-batches; the step is gated by a modulo but the warm-up/cosine is
# fed the loop index, which counts micro-batches, at every boundary
import math

import torch

accum_steps = 4
num_steps = 1000
warmup = 100


def lr_at(step, base=3e-4):
    if step < warmup:
        return base * step / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / (num_steps - warmup)))


for i in range(num_steps * accum_steps):
    x, y = next(batches)
    (torch.nn.functional.mse_loss(net(x), y) / accum_steps).backward()
    if (i + 1) % accum_steps == 0:
        for g in opt.param_groups:
            g["lr"] = lr_at(i)  # expect: AG130
        opt.step()
        opt.zero_grad()
