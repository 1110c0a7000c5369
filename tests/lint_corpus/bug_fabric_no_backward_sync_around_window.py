# corpus: style=fabric class=F11
# Fabric's no_backward_sync entered once around the window's loop: the last backward runs
# inside it too, so the ranks' gradients are never averaged
import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, opt = fabric.setup(model, torch.optim.AdamW(model.parameters()))
for step in range(100):
    batches = [next(data) for _ in range(4)]
    with fabric.no_backward_sync(model, enabled=True):  # expect: AG111
        for x, y in batches:
            fabric.backward(torch.nn.functional.mse_loss(model(x), y) / 4)
    opt.step()
    opt.zero_grad()
