# corpus: style=plain class=OK
import math

import torch
from torch.optim.lr_scheduler import OneCycleLR

accum_steps = 8
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
steps_per_epoch = math.ceil(len(train_loader) / accum_steps)
scheduler = OneCycleLR(optimizer, max_lr=0.4, epochs=epochs, steps_per_epoch=steps_per_epoch)
for epoch in range(epochs):
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y) / accum_steps  # expect: AG141
        loss.backward()
        if (i + 1) % accum_steps == 0 or i + 1 == len(train_loader):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
