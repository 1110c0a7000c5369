# corpus: style=lightning class=F3
# a callback clears the gradients after every batch while the Trainer accumulates 4
import lightning.pytorch as pl
import torch


class FreeGrads(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for opt in trainer.optimizers:
            opt.zero_grad()  # expect: AG192


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(loader):
    pl.Trainer(max_epochs=1, accumulate_grad_batches=4, callbacks=[FreeGrads()]).fit(Net(), loader)
