# corpus: style=fabric class=OK
# Fabric's no_backward_sync entered per micro-step, off on the window's last backward
import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, opt = fabric.setup(model, torch.optim.AdamW(model.parameters()))
for step in range(100):
    batches = [next(data) for _ in range(4)]
    for i, (x, y) in enumerate(batches):
        with fabric.no_backward_sync(model, enabled=i < 3):
            fabric.backward(torch.nn.functional.mse_loss(model(x), y) / 4)
    opt.step()
    opt.zero_grad()
