# corpus: style=accelerate class=F1
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
accum_steps = 4
for step, batch in enumerate(loader):
    loss = model(**batch).loss / accum_steps
    accelerator.backward(loss)
    optimizer.step()  # expect: AG101
    optimizer.zero_grad()
