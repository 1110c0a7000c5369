# corpus: style=fabric class=F10
# a hint regressor attached to the student after fabric.setup wrapped it: Fabric's DDP never
# registered it, and each rank steps it on its own gradient
import torch.nn as nn
from lightning_fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
student = Student()
optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
student, optimizer = fabric.setup(student, optimizer)
student.hint = nn.Linear(64, 128)  # expect: AG196
optimizer.add_param_group({"params": list(student.hint.parameters())})
for i, (x, y) in enumerate(loader):
    with fabric.no_backward_sync(student, enabled=(i + 1) % 4 != 0):
        fabric.backward(kd_loss(student, teacher, x, y) / 4)
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
