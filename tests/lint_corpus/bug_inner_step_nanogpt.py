# corpus: style=nanogpt class=F1
for it in range(max_iters):
    for micro_step in range(grad_accum_steps):
        x, y = next(loader)
        loss = model(x, y) / grad_accum_steps
        loss.backward()
        optimizer.step()  # expect: AG101
    optimizer.zero_grad(set_to_none=True)
