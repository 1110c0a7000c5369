# corpus: style=lightning class=OK
"""The fixed twin of bug_lightning_parameter_made_in_configure_optimizers: the temperature is
made in __init__, before the strategy wraps the module (blind round 127 c_b01 fixed)."""
import pytorch_lightning as pl
import torch
import torch.nn as nn


class Distiller(pl.LightningModule):
    def __init__(self, student):
        super().__init__()
        self.student = student
        self.log_tau = nn.Parameter(torch.zeros(()))

    def training_step(self, batch, batch_idx):
        x, t = batch
        return ((self.student(x) / self.log_tau.exp() - t) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD([{"params": self.student.parameters()},
                                {"params": [self.log_tau], "lr": 1e-2}], lr=1e-3)


def main(student, loader):
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=4)
    trainer.fit(Distiller(student), loader)
