# corpus: style=accelerate class=OK
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
