# corpus: style=plain class=F3
accum = 4
for i, (x, y) in enumerate(loader):
    for p in model.parameters():
        p.grad = None  # expect: AG102
    (crit(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
