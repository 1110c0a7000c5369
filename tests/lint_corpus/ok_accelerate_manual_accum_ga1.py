# corpus: style=accelerate class=OK
# the loop accumulates by hand and divides by its own K; the Accelerator is left at
# gradient_accumulation_steps=1, so accelerator.backward does not divide again
import torch
from accelerate import Accelerator

GRAD_ACCUM = 4
accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y) / GRAD_ACCUM
    accelerator.backward(loss)
    if (step + 1) % GRAD_ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
