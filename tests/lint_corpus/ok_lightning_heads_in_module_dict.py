# corpus: style=lightning class=OK
"""Per-teacher projector heads in an nn.ModuleDict under Lightning's DDP strategy; a plain
dict of frozen teachers' names to dims is no module container."""
import pytorch_lightning as pl
import torch
from torch import nn


class Distill(pl.LightningModule):
    def __init__(self, dims):
        super().__init__()
        self.student = nn.Linear(16, 32)
        self.projectors = nn.ModuleDict({n: nn.Linear(32, d) for n, d in dims})
        self.dims = {n: d for n, d in dims}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=2)
trainer.fit(Distill([("a", 8), ("b", 4)]), loader)
