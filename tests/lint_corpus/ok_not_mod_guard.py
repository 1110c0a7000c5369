# corpus: style=plain class=OK
for i, (x, y) in enumerate(loader):
    (loss_fn(model(x), y) / grad_accum).backward()
    if not (i + 1) % grad_accum:
        optimizer.step()
        optimizer.zero_grad()
