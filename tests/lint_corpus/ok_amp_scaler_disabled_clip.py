# corpus: style=amp class=OK
import torch

# bf16 needs no loss scaling: the scaler is kept for one code path but built disabled, so
# scale() returns the loss unchanged and the clip sees the true gradient.
accum_steps = 4
scaler = torch.amp.GradScaler("cuda", enabled=False)
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y) / accum_steps
    scaler.scale(loss).backward()
    if (i + 1) % accum_steps == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
