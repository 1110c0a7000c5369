# corpus: style=nanogpt class=F4
while iter_num < max_iters:
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        (loss / gradient_accumulation_steps).backward()
        scheduler.step()  # expect: AG103
        X, Y = get_batch("train")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
