# corpus: style=accelerate class=OK
# the horizon counts one process's optimizer steps from the prepared loader, and the scheduler
# is NOT prepared: it is stepped by hand once per optimizer step, at the sync boundary
import math

from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

grad_accum = 8
epochs = 3

accelerator = Accelerator(gradient_accumulation_steps=grad_accum)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
total_steps = epochs * math.ceil(len(train_loader) / grad_accum)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=total_steps)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            if accelerator.sync_gradients:
                scheduler.step()
            optimizer.zero_grad()
