# corpus: style=epochs class=OK
# one counter across epochs: a window that starts at the end of an epoch is completed by the first
# batches of the next one, so every optimizer step sees exactly K micro-batches (a deliberate
# cross-epoch window, not a leak)
import torch

grad_accum_steps = 8
global_micro = 0
for epoch in range(epochs):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y) / grad_accum_steps
        loss.backward()
        global_micro += 1
        if global_micro % grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
