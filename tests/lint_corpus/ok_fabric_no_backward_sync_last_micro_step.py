# corpus: style=fabric class=OK
# the Fabric recipe: accumulate (skip the sync) on every micro-step but the window's last
import torch
from lightning_fabric import Fabric

K = 6
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(loader)
for micro_step, (x, y) in enumerate(loader):
    is_accumulating = (micro_step + 1) % K != 0
    with fabric.no_backward_sync(model, enabled=is_accumulating):
        loss = torch.nn.functional.cross_entropy(model(x), y) / K
        fabric.backward(loss)
    if not is_accumulating:
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
