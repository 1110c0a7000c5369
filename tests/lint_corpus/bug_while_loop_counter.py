# corpus: style=while_loop class=F4
# a while loop with a hand-kept micro-step counter; the scheduler ignores it
micro_step = 0
accumulation_steps = 4
while not done:
    batch = next(it)
    loss = model(batch) / accumulation_steps
    loss.backward()
    micro_step += 1
    if micro_step == accumulation_steps:
        optimizer.step()
        optimizer.zero_grad()
        micro_step = 0
    scheduler.step()  # expect: AG103
