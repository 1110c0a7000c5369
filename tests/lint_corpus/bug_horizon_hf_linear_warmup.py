# corpus: style=hf class=F4
from transformers import get_linear_schedule_with_warmup

gradient_accumulation_steps = 4
num_epochs = 3
total_steps = len(train_dataloader) * num_epochs
scheduler = get_linear_schedule_with_warmup(optimizer, 100, total_steps)  # expect: AG124
model.train()
for epoch in range(num_epochs):
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        (outputs.loss / gradient_accumulation_steps).backward()
        if (step + 1) % gradient_accumulation_steps == 0:  # expect: AG117
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
