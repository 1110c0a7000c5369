# corpus: style=lightning class=OK
"""The fixed twin of bug_lightning_reduce_python_number: a tensor is reduced. Fabric's
all_reduce of a Python number is right as well (it makes a tensor of it first)."""
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def _mean_rows(self, n_rows):
        return self.trainer.strategy.reduce(torch.tensor(float(n_rows), device=self.device))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="sum") / self._mean_rows(y.numel())


def global_rows(fabric, n_rows):
    return fabric.all_reduce(float(n_rows), reduce_op="mean")
