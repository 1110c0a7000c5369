# corpus: style=while_loop class=OK
# The counter is bumped before the test: it is 1 on the first micro-batch.
step = 0
grad_accumulation_steps = 4
for batch in loader:
    step += 1
    loss = model(**batch).loss / grad_accumulation_steps
    loss.backward()
    if step % grad_accumulation_steps == 0:
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
