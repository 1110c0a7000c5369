# corpus: style=hf class=OK
import math

from transformers import get_cosine_schedule_with_warmup

gradient_accumulation_steps = 4
num_epochs = 3
updates_per_epoch = math.ceil(len(train_dataloader) / gradient_accumulation_steps)
scheduler = get_cosine_schedule_with_warmup(optimizer, 100, updates_per_epoch * num_epochs)
for epoch in range(num_epochs):
    for step, batch in enumerate(train_dataloader):
        (model(**batch).loss / gradient_accumulation_steps).backward()  # expect: AG141
        if (step + 1) % gradient_accumulation_steps == 0 or step + 1 == len(train_dataloader):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
