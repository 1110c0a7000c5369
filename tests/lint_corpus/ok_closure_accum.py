# corpus: style=closure class=OK
# Accumulation inside a closure: the closure loops over K micro-batches.
import torch

K = 4
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    micro = batch.chunk(K)

    def closure():
        optimizer.zero_grad()
        total = 0.0
        for mb in micro:
            loss = model(mb).sum() / len(batch)
            loss.backward()
            total += loss.item()
        return total

    optimizer.step(closure)
