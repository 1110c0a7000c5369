# corpus: style=plain class=F4
import torch
from transformers import get_linear_schedule_with_warmup

optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
lr_sched = get_linear_schedule_with_warmup(optimizer, 100, 10_000)
gradient_accumulation_steps = 4
for step, batch in enumerate(train_dataloader):
    out = model(**batch)
    (out.loss / gradient_accumulation_steps).backward()
    lr_sched.step()  # expect: AG103
    if (step + 1) % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
