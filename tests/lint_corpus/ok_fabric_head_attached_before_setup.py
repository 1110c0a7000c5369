# corpus: style=fabric class=OK
# the hint regressor attached before fabric.setup: Fabric's DDP holds it with the student
import torch.nn as nn
from lightning_fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
student = Student()
student.hint = nn.Linear(64, 128)
optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
student, optimizer = fabric.setup(student, optimizer)
for i, (x, y) in enumerate(loader):
    with fabric.no_backward_sync(student, enabled=(i + 1) % 4 != 0):
        fabric.backward(kd_loss(student, teacher, x, y) / 4)
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
