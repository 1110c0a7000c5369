# corpus: style=epochs class=OK
# the leftover of each epoch is stepped on after the loop, its loss normalised by its own size
import torch

K = 4
for epoch in range(num_epochs):
    n = len(loader)
    tail = n % K
    for step, (x, y) in enumerate(loader):
        in_tail = step >= n - tail
        (criterion(model(x), y) / (tail if in_tail else K)).backward()
        if (step + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
    if tail:
        optimizer.step()
        optimizer.zero_grad()
