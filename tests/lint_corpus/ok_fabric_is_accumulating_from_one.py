# corpus: style=fabric class=OK
import torch
from lightning.fabric import Fabric

ACCUM = 4


def fit(model, loader, epochs=2):
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for _ in range(epochs):
        for step, (x, y) in enumerate(loader):
            accumulating = (step + 1) % ACCUM != 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
                fabric.backward(loss)
            if not accumulating:
                optimizer.step()
                optimizer.zero_grad()
        optimizer.zero_grad()  # an epoch's partial last window is dropped, not carried over
