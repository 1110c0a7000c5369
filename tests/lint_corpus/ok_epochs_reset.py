# corpus: style=epochs class=OK
import torch

accumulation_steps = 4
for epoch in range(num_epochs):
    model.train()
    optimizer.zero_grad()
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y)
        is_last = (i + 1) % accumulation_steps == 0 or i + 1 == len(train_loader)
        (loss / accumulation_steps).backward()  # expect: AG141
        if is_last:
            optimizer.step()
            optimizer.zero_grad()
    scheduler.step()
