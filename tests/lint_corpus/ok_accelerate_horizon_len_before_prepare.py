# corpus: style=accelerate class=OK
# Accelerate's convention: the horizon is read from the loader BEFORE prepare (the batches of
# every process), so it counts the prepared scheduler's own steps (num_processes per update)
import math

import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

GRAD_ACCUM, EPOCHS = 4, 2

accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
train_dataloader = DataLoader(train_set, batch_size=8, shuffle=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
num_training_steps = EPOCHS * math.ceil(len(train_dataloader) / GRAD_ACCUM)
lr_scheduler = get_linear_schedule_with_warmup(optimizer, 10, num_training_steps)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / GRAD_ACCUM)
for epoch in range(EPOCHS):
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
