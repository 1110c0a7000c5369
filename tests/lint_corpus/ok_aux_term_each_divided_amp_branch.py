# corpus: style=amp class=OK
import torch
import torch.nn.functional as F

accum_steps = 8
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
        logits, balance = model(x)
        loss = F.cross_entropy(logits, y) / accum_steps + balance_coef * balance / accum_steps
    if use_amp:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if (i + 1) % accum_steps == 0:
        if use_amp:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
