# corpus: style=accelerate class=LOSS_SCALE
# the loss is divided by the accumulation steps, as in a hand-written loop, and then handed
# to accelerator.backward, which divides by gradient_accumulation_steps again: G / K
import torch
from accelerate import Accelerator

GRAD_ACCUM = 8
accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, (x, y) in enumerate(loader):
    with accelerator.accumulate(model):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss = loss / GRAD_ACCUM  # expect: AG121
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
