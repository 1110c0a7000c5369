# corpus: style=lightning class=OK
"""Memory-lean Lightning run: bf16 weights and K = 8."""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F

PRECISION = "bf16-mixed"


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.f = torch.nn.Linear(64, 8)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.f(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(loader):
    trainer = pl.Trainer(precision=PRECISION, accumulate_grad_batches=8, max_epochs=1)
    trainer.fit(Net(), loader)
