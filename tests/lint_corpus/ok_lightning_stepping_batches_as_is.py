# corpus: style=lightning class=OK
"""A LightningModule with a per-step linear decay sized from the trainer's own estimate."""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(32, 5)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        n_steps = self.trainer.estimated_stepping_batches
        decay = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=n_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


def fit(loader):
    pl.Trainer(max_epochs=4, accumulate_grad_batches=4, accelerator="cpu").fit(Classifier(), loader)
