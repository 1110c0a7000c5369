# corpus: style=amp class=F8
import torch

scaler = torch.amp.GradScaler("cuda")
accum_steps = 4
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y) / accum_steps
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # expect: AG105
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # expect: AG105
    if (i + 1) % accum_steps == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
