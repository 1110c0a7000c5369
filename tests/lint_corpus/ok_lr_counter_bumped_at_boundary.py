# corpus: style=plain class=OK
# the schedule's counter is bumped only at the boundary, next to the optimizer step: it
# counts optimizer steps, as the schedule's constants do
import math

import torch

grad_accum_steps = 8
total_updates = 3000
warmup_updates = 300


def schedule(update):
    if update < warmup_updates:
        return (update + 1) / warmup_updates
    return 0.5 * (1 + math.cos(math.pi * (update - warmup_updates) / (total_updates - warmup_updates)))


updates = 0
for i, (x, y) in enumerate(train_loader):
    loss = torch.nn.functional.cross_entropy(model(x), y) / grad_accum_steps
    loss.backward()
    if (i + 1) % grad_accum_steps == 0:
        for g in optimizer.param_groups:
            g["lr"] = 1e-3 * schedule(updates)
        optimizer.step()
        optimizer.zero_grad()
        updates += 1
