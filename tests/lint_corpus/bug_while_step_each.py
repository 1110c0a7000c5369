# corpus: style=while_loop class=F1
import torch

grad_accumulation = 8
it = iter(loader)
done = False
while not done:
    try:
        batch = next(it)
    except StopIteration:
        done = True
        continue
    loss = model(batch) / grad_accumulation
    loss.backward()
    optimizer.step()  # expect: AG101
    optimizer.zero_grad()
