# corpus: style=accelerate class=OK
# the horizon is read from the prepared loader and multiplied by the number of processes:
# counted in the prepared scheduler's own steps (num_processes per optimizer step)
import math

from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

grad_accum = 8
epochs = 3

accelerator = Accelerator(gradient_accumulation_steps=grad_accum)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
steps_per_epoch = math.ceil(len(train_loader) / grad_accum)
total_steps = epochs * steps_per_epoch * accelerator.num_processes
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=total_steps)
scheduler = accelerator.prepare(scheduler)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
