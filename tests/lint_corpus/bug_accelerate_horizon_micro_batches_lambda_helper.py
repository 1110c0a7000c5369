# corpus: style=accelerate class=F4
# Accelerate accumulates over 4 batches and the prepared scheduler advances only when the
# optimizer steps, but the horizon counts every batch: the linear decay ends 4 x late
import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR


def linear_schedule(opt, num_training_steps):
    return LambdaLR(opt, lambda s: max(0.0, 1 - s / num_training_steps))


accelerator = Accelerator(gradient_accumulation_steps=4)
model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
epochs = 3
scheduler = linear_schedule(optimizer, epochs * len(train_loader))  # expect: AG124
model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
for epoch in range(epochs):
    for batch in train_loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
