# corpus: style=plain class=F13
# enumerate counts from 0 and the step follows the backward: the first window has 1 micro-batch
accumulation_steps = 4
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accumulation_steps
    loss.backward()
    if i % accumulation_steps == 0:  # expect: AG115
        optimizer.step()
        optimizer.zero_grad()
