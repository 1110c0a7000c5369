# corpus: style=lightning class=OK
# the same short last window, its loss scaled back by K / (batches in this window)
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
        loss = torch.nn.functional.cross_entropy(self.head(x), y)
        k = self.trainer.accumulate_grad_batches
        start = (batch_idx // k) * k
        return loss * k / min(k, self.trainer.num_training_batches - start)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(max_epochs=3, accumulate_grad_batches=3, logger=False)
trainer.fit(Probe(), DataLoader(make_data(), batch_size=4))
