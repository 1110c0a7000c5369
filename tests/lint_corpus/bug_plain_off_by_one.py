# corpus: style=plain class=F13 miss=the first window has one micro-batch; needs the counter's start value
accumulation_steps = 4
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accumulation_steps
    loss.backward()
    if i % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
