# corpus: style=plain class=OK
accum_steps = 4
for i, (x, y) in enumerate(loader):
    (crit(model(x), y) / accum_steps).backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
        ema.update(model)
