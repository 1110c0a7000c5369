# corpus: style=lightning class=F7
# 44 rows in batches of 4 are 11 batches per epoch; with 3 accumulated batches each epoch's
# last window holds 2 batches, each loss still divided by 3
import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

ROWS = 44


def make_data():
    feats = torch.randn(ROWS, 16)
    labels = torch.randint(0, 5, (ROWS,))
    return TensorDataset(feats, labels)


class Probe(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 5)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(max_epochs=3, accumulate_grad_batches=3, logger=False)  # expect: AG131
trainer.fit(Probe(), DataLoader(make_data(), batch_size=4))
