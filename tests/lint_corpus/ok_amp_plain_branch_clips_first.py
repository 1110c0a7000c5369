# corpus: style=amp class=OK
import torch

accum_steps = 4
scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    if not use_amp:
        loss.backward()
    else:
        scaler.scale(loss).backward()
    if (i + 1) % accum_steps == 0:
        if not use_amp:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        else:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
