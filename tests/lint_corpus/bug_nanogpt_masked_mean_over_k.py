# corpus: style=nanogpt class=F5
for micro_step in range(gradient_accumulation_steps):
    X, Y = get_batch("train")
    logits = model(X)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), Y.view(-1), ignore_index=-1)
    loss = loss / gradient_accumulation_steps  # expect: AG104
    loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
