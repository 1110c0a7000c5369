# corpus: style=fabric class=OK
# a dual encoder set up with Fabric's DDP; the loop calls the model itself, whose
# forward runs both towers: DDP's forward runs and the gradients are averaged
import torch
from lightning_fabric import Fabric


class DualEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.query_tower = torch.nn.Linear(16, 8)
        self.doc_tower = torch.nn.Linear(16, 8)

    def forward(self, q, d):
        return self.query_tower(q), self.doc_tower(d)


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(DualEncoder(), torch.optim.AdamW(params, lr=1e-3))
for i, (q, d) in enumerate(loader):
    with fabric.no_backward_sync(model, enabled=(i + 1) % 4 != 0):
        qe, de = model(q, d)
        fabric.backward(contrastive(qe, de) / 4)
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
