# corpus: style=amp class=F1
import torch

scaler = torch.cuda.amp.GradScaler()
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda"):
        loss = criterion(model(x), y) / accumulation_steps
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # expect: AG101
    scaler.update()
    optimizer.zero_grad()
