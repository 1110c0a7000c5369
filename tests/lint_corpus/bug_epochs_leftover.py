# corpus: style=epochs class=F7
import torch

accumulation_steps = 4
for epoch in range(epochs):
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y) / accumulation_steps
        loss.backward()
        if (i + 1) % accumulation_steps == 0:  # expect: AG117
            optimizer.step()
            optimizer.zero_grad()
