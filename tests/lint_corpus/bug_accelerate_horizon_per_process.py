# corpus: style=accelerate class=F4
import math

from accelerate import Accelerator
from transformers import get_scheduler

accelerator = Accelerator(gradient_accumulation_steps=8, mixed_precision="bf16")
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps)
max_train_steps = args.num_train_epochs * num_update_steps_per_epoch // accelerator.num_processes
lr_scheduler = get_scheduler(  # expect: AG125
    "cosine", optimizer=optimizer, num_warmup_steps=0, num_training_steps=max_train_steps
)
lr_scheduler = accelerator.prepare(lr_scheduler)
for epoch in range(args.num_train_epochs):
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
