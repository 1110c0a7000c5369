# corpus: style=accelerate class=OK
from accelerate import Accelerator

from mytrain.utils import grad_accumulation  # calls accelerator.accumulate(model) inside

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with grad_accumulation(accelerator, model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
