# corpus: style=plain class=F4
import torch
from torch.optim.lr_scheduler import OneCycleLR

accum_steps = 8
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = OneCycleLR(optimizer, max_lr=0.4, epochs=epochs, steps_per_epoch=len(train_loader))  # expect: AG124
for epoch in range(epochs):
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y) / accum_steps  # expect: AG141
        loss.backward()
        if (i + 1) % accum_steps == 0 or i + 1 == len(train_loader):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
