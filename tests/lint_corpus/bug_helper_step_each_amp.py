# corpus: style=amp class=F1
import torch

scaler = torch.cuda.amp.GradScaler()
accum_steps = 4


def backward_step(loss):
    scaler.scale(loss / accum_steps).backward()
    scaler.step(optimizer)  # expect: AG101
    scaler.update()
    optimizer.zero_grad()


for epoch in range(3):
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch).mean()
        backward_step(loss)
