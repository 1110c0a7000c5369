# corpus: style=accelerate class=F4
# the scheduler is left out of prepare() and stepped by hand only when Accelerate syncs (once
# per window of 8), but its horizon counts the loader's micro-batches: 8 x too long
import math

from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

EPOCHS = 3
acc = Accelerator(gradient_accumulation_steps=8)
model, optim, loader = acc.prepare(model, optim, loader)
sched = get_linear_schedule_with_warmup(optim, num_warmup_steps=50, num_training_steps=EPOCHS * len(loader))  # expect: AG124
for epoch in range(EPOCHS):
    for batch in loader:
        with acc.accumulate(model):
            acc.backward(model(**batch).loss)
            optim.step()
            if acc.sync_gradients:
                sched.step()
            optim.zero_grad()
