# corpus: style=fabric class=F11
# Lightning Fabric: the sync is skipped while `enabled` holds; written as "accumulating unless
# this is the window's first micro-step", it syncs the first micro-step and never the last
import torch
from lightning_fabric import Fabric

K = 6
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(loader)
for micro_step, (x, y) in enumerate(loader):
    is_accumulating = micro_step % K != 0
    with fabric.no_backward_sync(model, enabled=is_accumulating):  # expect: AG111
        loss = torch.nn.functional.cross_entropy(model(x), y) / K
        fabric.backward(loss)
    if (micro_step + 1) % K == 0:
        optimizer.step()
        optimizer.zero_grad()
