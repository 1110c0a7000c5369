# corpus: style=while_loop class=OK
step = 0
while step < max_steps:
    for micro_step in range(gradient_accumulation_steps):
        x, y = get_batch("train")
        loss = model(x, y) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
