# corpus: style=fabric class=LOSS_SCALE
import torch
from lightning.fabric import Fabric

GRAD_ACCUM = 4


def fit(model, loader, epochs=1):
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % GRAD_ACCUM == 0
            with fabric.no_backward_sync(model, enabled=not boundary):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                fabric.backward(loss)  # expect: AG122
            if boundary:
                optimizer.step()
                optimizer.zero_grad()
        optimizer.zero_grad()
