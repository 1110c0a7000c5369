# corpus: style=accelerate class=OK
"""Each batch is split into K chunks inside one accumulate() block; the Accelerator
accumulates nothing itself (K = 1): one step per batch, on the mean of its chunks."""
import torch
from accelerate import Accelerator

GRAD_ACCUM = 8
accelerator = Accelerator(mixed_precision="no")
model, optimizer, loader = accelerator.prepare(build_model(), build_optimizer(), build_loader())

for batch in loader:
    with accelerator.accumulate(model):
        for chunk in batch["input_ids"].chunk(GRAD_ACCUM):
            out = model(input_ids=chunk, labels=chunk)
            accelerator.backward(out.loss / GRAD_ACCUM)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
