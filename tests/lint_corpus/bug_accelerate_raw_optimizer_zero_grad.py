# corpus: style=accelerate class=F3
# the prepared optimizer steps, but zero_grad runs on the raw object given to prepare: it is
# not gated on the sync steps and clears every micro-batch's gradient
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step()
        optimizer.zero_grad()  # expect: AG361
