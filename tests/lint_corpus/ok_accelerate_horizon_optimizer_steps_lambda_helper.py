# corpus: style=accelerate class=OK
# the same loop with the horizon counted in optimizer steps: ceil(len / K) per epoch
import math

import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR


def linear_schedule(opt, num_training_steps):
    return LambdaLR(opt, lambda s: max(0.0, 1 - s / num_training_steps))


grad_accum = 4
accelerator = Accelerator(gradient_accumulation_steps=grad_accum)
model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
epochs = 3
scheduler = linear_schedule(optimizer, epochs * math.ceil(len(train_loader) / grad_accum))
model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
