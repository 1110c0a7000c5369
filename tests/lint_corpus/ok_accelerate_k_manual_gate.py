# corpus: style=accelerate class=OK
from accelerate import Accelerator

accum = 4
accelerator = Accelerator(gradient_accumulation_steps=accum)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for i, batch in enumerate(loader):
    loss = model(**batch).loss
    accelerator.backward(loss)  # divides by 4; the step below waits for 4 batches
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
