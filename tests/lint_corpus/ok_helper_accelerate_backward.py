# corpus: style=accelerate class=OK
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)


def backward(loss):
    accelerator.backward(loss)
    if accelerator.sync_gradients:
        accelerator.clip_grad_norm_(model.parameters(), 1.0)


for batch in loader:
    with accelerator.accumulate(model):
        backward(model(**batch).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
