# corpus: style=amp class=OK
for i, (x, y) in enumerate(loader):
    should_step = (i + 1) % accumulation_steps == 0
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y) / accumulation_steps
    scaler.scale(loss).backward()
    if should_step:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
