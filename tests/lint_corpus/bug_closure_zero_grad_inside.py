# corpus: style=closure class=F3
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    def closure():
        total = 0.0
        for mb in batch.chunk(4):
            optimizer.zero_grad()  # expect: AG102
            loss = model(mb).mean() / 4
            loss.backward()
            total += loss.item()
        return total

    optimizer.step(closure)
