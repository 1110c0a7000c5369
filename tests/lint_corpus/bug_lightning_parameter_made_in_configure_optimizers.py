# corpus: style=lightning class=F10
"""A Lightning distiller creating its learned temperature in configure_optimizers, which the
DDP strategy calls after wrapping the module (blind round 127 c_b01)."""
import pytorch_lightning as pl
import torch
import torch.nn as nn


class Distiller(pl.LightningModule):
    def __init__(self, student):
        super().__init__()
        self.student = student

    def training_step(self, batch, batch_idx):
        x, t = batch
        return ((self.student(x) / self.log_tau.exp() - t) ** 2).mean()

    def configure_optimizers(self):
        self.log_tau = nn.Parameter(torch.zeros(()))  # expect: AG356
        return torch.optim.SGD([{"params": self.student.parameters()},
                                {"params": [self.log_tau], "lr": 1e-2}], lr=1e-3)


def main(student, loader):
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=4)
    trainer.fit(Distiller(student), loader)
