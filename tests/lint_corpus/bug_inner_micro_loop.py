# corpus: style=plain class=F1
import torch


def train(model, optimizer, loader, micro_batches: int = 4):
    for batch in loader:
        for chunk in torch.chunk(batch, micro_batches):
            loss = model(chunk).mean() / micro_batches
            loss.backward()
            optimizer.step()  # expect: AG101
            optimizer.zero_grad()
