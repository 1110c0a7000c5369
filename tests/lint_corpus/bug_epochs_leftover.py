# corpus: style=epochs class=F7 miss=the leftover window depends on len(loader) % K at run time
import torch

accumulation_steps = 4
for epoch in range(epochs):
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y) / accumulation_steps
        loss.backward()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
