# corpus: style=accelerate class=F14
"""Each batch is split into K chunks inside one accumulate() block, and the Accelerator
was also told to accumulate K: it steps once every K batches."""
import torch
from accelerate import Accelerator

GRAD_ACCUM = 8
accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM, mixed_precision="no")
model, optimizer, loader = accelerator.prepare(build_model(), build_optimizer(), build_loader())

for batch in loader:
    with accelerator.accumulate(model):  # expect: AG171
        for chunk in batch["input_ids"].chunk(GRAD_ACCUM):
            out = model(input_ids=chunk, labels=chunk)
            accelerator.backward(out.loss / GRAD_ACCUM)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
