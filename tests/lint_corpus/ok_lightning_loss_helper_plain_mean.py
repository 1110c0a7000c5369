# corpus: style=lightning class=OK
# the loss helper returns the plain mean; Lightning divides by accumulate_grad_batches
from dataclasses import dataclass

import lightning.pytorch as pl
import torch.nn.functional as F


@dataclass
class Config:
    accumulate_grad_batches: int = 4


def span_loss(logits, labels, cfg):
    return F.cross_entropy(logits, labels)


class Tagger(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = span_loss(self(x), y, self.cfg)
        return loss


cfg = Config()
trainer = pl.Trainer(accumulate_grad_batches=cfg.accumulate_grad_batches)
