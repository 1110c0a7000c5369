# corpus: style=lightning class=F6
"""A LightningModule normalising by the mean micro-batch size over the ranks, reduced as a
Python float: Lightning's strategy.reduce returns it unchanged, so each rank divides by its
own size (blind round 126 c_b01)."""
import pytorch_lightning as pl
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def _mean_rows(self, n_rows):
        return self.trainer.strategy.reduce(float(n_rows))  # expect: AG352

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="sum") / self._mean_rows(y.numel())
