# corpus: style=nanogpt class=F4
# a flat pass over a stream of micro-batches named `micro_batches`: the learning rate is
# computed from the stream's index, which counts micro-batches, while the optimizer steps
# every K-th one: the schedule runs K positions per optimizer step
import math

import torch


def get_lr(it, lr=1e-3, warmup_iters=8, decay_iters=40, min_lr=1e-4):
    if it < warmup_iters:
        return lr * (it + 1) / warmup_iters
    ratio = min(1.0, (it - warmup_iters) / (decay_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def train(model, optimizer, get_batch, max_iters, grad_accum):
    micro_batches = (get_batch(i) for i in range(max_iters * grad_accum))
    for step, (X, Y) in enumerate(micro_batches):
        lr = get_lr(step)
        for pg in optimizer.param_groups:
            pg["lr"] = lr  # expect: AG130
        loss = model(X, Y) / grad_accum
        loss.backward()
        if (step + 1) % grad_accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
