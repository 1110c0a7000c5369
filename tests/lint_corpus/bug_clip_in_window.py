# corpus: style=plain class=F8
import torch

scaler = torch.amp.GradScaler("cuda")


def train_epoch(model, optimizer, loader, accumulation_steps=4, max_norm=1.0):
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation_steps
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # expect: AG105
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # expect: AG105
        if (i + 1) % accumulation_steps == 0:  # expect: AG117
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
