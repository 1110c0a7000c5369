# corpus: style=accelerate class=OK
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for epoch in range(epochs):
    for batch in loader:
        optimizer.zero_grad()
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
