# corpus: style=amp_modulo class=LOSS_SCALE
import torch

accumulation_steps = 8
scaler = torch.amp.GradScaler("cuda")


def fit(model, loader, optimizer, criterion=torch.nn.CrossEntropyLoss()):
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            loss = criterion(out, y).mean()
        scaler.scale(loss).backward()  # expect: AG122
        if (i + 1) % accumulation_steps == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
