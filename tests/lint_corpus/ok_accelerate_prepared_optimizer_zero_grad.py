# corpus: style=accelerate class=OK
# the prepared optimizer steps and clears: both gated on the sync steps by Accelerate
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
