# corpus: style=lightning class=OK
# the callback clears only after a window's last batch (after Lightning stepped)
import lightning.pytorch as pl
import torch


class FreeGrads(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for opt in trainer.optimizers:
            if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
                opt.zero_grad()


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
