# corpus: style=amp class=F8
for step in range(steps):
    for micro in range(accum_steps):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(next(it)) / accum_steps
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # expect: AG105
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # expect: AG105
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
