# corpus: style=lightning class=F7
# 80 rows in batches of 4 are 20 batches, a multiple of K = 4; but on 2 devices each process
# takes 40 rows (Lightning's distributed sampler): 10 batches, and each epoch ends in a window of 2
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

xs = torch.randn(80, 8)
ys = torch.randn(80, 1)


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=4, max_epochs=3)  # expect: AG131
trainer.fit(Regressor(), DataLoader(TensorDataset(xs, ys), batch_size=4))
