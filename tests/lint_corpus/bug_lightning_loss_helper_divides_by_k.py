# corpus: style=lightning class=LOSS_SCALE
# a loss helper carried over from a hand-written loop divides by K; Lightning divides the
# returned loss by accumulate_grad_batches again
from dataclasses import dataclass

import lightning.pytorch as pl
import torch.nn.functional as F


@dataclass
class Config:
    accumulate_grad_batches: int = 4


def span_loss(logits, labels, cfg):
    return F.cross_entropy(logits, labels) / cfg.accumulate_grad_batches


class Tagger(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = span_loss(self(x), y, self.cfg)
        return loss  # expect: AG173


cfg = Config()
trainer = pl.Trainer(accumulate_grad_batches=cfg.accumulate_grad_batches)
