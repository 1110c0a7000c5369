# corpus: style=nanogpt class=LOSS_SCALE
gradient_accumulation_steps = 8
z_loss_weight = 1e-4
for iter_num in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss, z_loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            loss += z_loss_weight * z_loss  # expect: AG127
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
