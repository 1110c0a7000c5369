# corpus: style=nanogpt class=F11
for micro_step in range(gradient_accumulation_steps):
    model.require_backward_grad_sync = micro_step != gradient_accumulation_steps - 1  # expect: AG111
    logits, loss = model(X, Y)
    loss = loss / gradient_accumulation_steps
    X, Y = get_batch("train")
    loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
