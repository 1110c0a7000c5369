# corpus: style=accelerate class=F4
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
lr_scheduler = get_scheduler("linear", optimizer, num_warmup_steps=100, num_training_steps=total_steps)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:
        for _ in range(accelerator.num_processes):
            lr_scheduler.step()  # expect: AG114
