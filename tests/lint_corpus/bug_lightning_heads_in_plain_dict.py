# corpus: style=lightning class=F10
"""Per-teacher projector heads in a plain dict under Lightning's DDP strategy: never
registered, so DDP never averages their gradients (blind round 122 c_b01)."""
import pytorch_lightning as pl
import torch
from torch import nn


class Distill(pl.LightningModule):
    def __init__(self, dims):
        super().__init__()
        self.student = nn.Linear(16, 32)
        self.projectors = {n: nn.Linear(32, d) for n, d in dims}  # expect: AG344

    def configure_optimizers(self):
        params = list(self.student.parameters())
        for proj in self.projectors.values():
            params += list(proj.parameters())
        return torch.optim.AdamW(params, lr=1e-3)


trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=2)
trainer.fit(Distill([("a", 8), ("b", 4)]), loader)
