# corpus: style=accelerate class=LOSS_SCALE
# the loss divided by the accelerator's own accumulation steps before accelerator.backward,
# which divides by them again
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4, mixed_precision="bf16")
model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
for batch in dataloader:
    with accelerator.accumulate(model):
        out = model(**batch)
        scaled = out.loss / accelerator.gradient_accumulation_steps  # expect: AG121
        accelerator.backward(scaled)
        optimizer.step()
        optimizer.zero_grad()
