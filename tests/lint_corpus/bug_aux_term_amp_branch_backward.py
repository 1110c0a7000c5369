# corpus: style=amp class=LOSS_SCALE
import torch
import torch.nn.functional as F

accum_steps = 8
balance_coef = 0.02
scaler = torch.amp.GradScaler("cuda") if use_amp else None
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
        logits, balance = model(x)
        loss = F.cross_entropy(logits, y) / accum_steps + balance_coef * balance  # expect: AG127
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if (i + 1) % accum_steps == 0:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
