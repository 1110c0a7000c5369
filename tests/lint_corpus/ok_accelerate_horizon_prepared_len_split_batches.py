# corpus: style=accelerate class=OK
# split_batches=True: the prepared scheduler steps once per optimizer step, and the
# prepared loader's length is the number of global batches: the horizon is right
import math

from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

grad_accum = 8
epochs = 3

accelerator = Accelerator(gradient_accumulation_steps=grad_accum, split_batches=True)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
total_steps = epochs * math.ceil(len(train_loader) / grad_accum)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=total_steps)
scheduler = accelerator.prepare(scheduler)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
