# corpus: style=lightning class=F7
# the DataModule builds 36 rows from its settings and serves batches of 4: 9 batches per
# epoch with accumulate_grad_batches=4, so each epoch ends in a window of 1 still divided by 4
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

SETTINGS = {"rows": 36, "batch": 4, "accum": 4, "width": 10}


class Tabular(pl.LightningDataModule):
    def __init__(self, settings):
        super().__init__()
        self.settings = settings

    def setup(self, stage=None):
        feats = torch.randn(self.settings["rows"], self.settings["width"])
        feats = feats / feats.norm(dim=1, keepdim=True)
        self.train_set = TensorDataset(feats, torch.randint(0, 3, (self.settings["rows"],)))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.settings["batch"], num_workers=2)


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(10, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=4, accumulate_grad_batches=SETTINGS["accum"])  # expect: AG131
trainer.fit(Model(), datamodule=Tabular(SETTINGS))
