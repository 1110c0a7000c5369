# corpus: style=plain class=OK
# The step for the previous window runs at the top of the next one (i > 0 skips the
# empty start), before this micro-batch's backward; the last window is flushed after.
accumulation_steps = 4
for i, batch in enumerate(loader):
    if i > 0 and i % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
    loss = model(batch).mean() / accumulation_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()
