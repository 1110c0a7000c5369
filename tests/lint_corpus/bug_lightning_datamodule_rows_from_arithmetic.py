# corpus: style=lightning class=F7
# the DataModule sizes its data as batches x batch size (7 batches of 6), K = 3: each epoch
# ends in a window of 1 batch, still divided by 3
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

K, BS, N_BATCHES = 3, 6, 7


class Pairs(pl.LightningDataModule):
    def setup(self, stage=None):
        a = torch.randn(BS * N_BATCHES, 4)
        self.ds = TensorDataset(a, a.sum(dim=1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=BS)


class Fit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        a, b = batch
        return torch.nn.functional.mse_loss(self.lin(a), b)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


trainer = pl.Trainer(accumulate_grad_batches=K, max_epochs=2, devices=1)  # expect: AG131
trainer.fit(Fit(), datamodule=Pairs())
