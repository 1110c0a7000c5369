# corpus: style=fabric class=F10
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric


def main(model, loader, accum=4):
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.setup_module(model)  # expect: AG377
    opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    loader = fabric.setup_dataloaders(loader)
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / accum
        fabric.backward(loss)
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
