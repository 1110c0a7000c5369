# corpus: style=accelerate class=OK
import math

from accelerate import Accelerator
from transformers import get_scheduler

accelerator = Accelerator(gradient_accumulation_steps=8)
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes / 8)
max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
lr_scheduler = get_scheduler(
    "linear", optimizer=optimizer, num_warmup_steps=0,
    num_training_steps=max_train_steps * accelerator.num_processes,
)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
for epoch in range(args.num_train_epochs):
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
