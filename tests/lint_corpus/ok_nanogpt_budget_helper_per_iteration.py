# corpus: style=nanogpt class=OK
"""A nanoGPT fork whose budgets are in samples, converted by a helper that divides by the
samples of one iteration (grad_accum micro-batches)."""
import math

import torch

grad_accum = 8
batch_size = 16
total_samples = 2_000_000
warmup_samples = 50_000
samples_per_iter = grad_accum * batch_size


def samples_to_steps(n_samples):
    return math.ceil(n_samples / samples_per_iter)


max_iters = total_samples // samples_per_iter
warmup_iters = samples_to_steps(warmup_samples)
model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)


def get_lr(it):
    return 6e-4 * min(1.0, (it + 1) / warmup_iters)


for it in range(max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(it)
    for micro in range(grad_accum):
        x, y = get_batch()
        loss = model(x, y) / grad_accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
