# corpus: style=accelerate class=F4 miss=horizon in one process's micro-batches with K > 1 is off by K / W, whose direction depends on the process count
# the horizon counts one process's micro-batches (no division by K) while the prepared
# scheduler advances num_processes times per optimizer step: off by K / W
import math

from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = get_cosine_schedule_with_warmup(optimizer, 10, 3 * len(loader))
scheduler = accelerator.prepare(scheduler)
for epoch in range(3):
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
