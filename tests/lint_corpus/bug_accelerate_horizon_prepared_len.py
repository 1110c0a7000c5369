# corpus: style=accelerate class=F4
# no_trainer-style: the horizon is computed after prepare from the prepared (per-process)
# loader, in optimizer steps, and the scheduler is prepared afterwards (advances W per step)
import math

from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

grad_accum = 8
epochs = 3

accelerator = Accelerator(gradient_accumulation_steps=grad_accum, mixed_precision="bf16")
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
steps_per_epoch = math.ceil(len(train_loader) / grad_accum)
total_steps = epochs * steps_per_epoch
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=total_steps)  # expect: AG125
scheduler = accelerator.prepare(scheduler)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
