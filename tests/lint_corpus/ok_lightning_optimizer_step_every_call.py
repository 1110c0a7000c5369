# corpus: style=lightning class=OK
# an optimizer_step override that steps on every call: Lightning gates the window
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.n_calls = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step(closure=optimizer_closure)


def main(loader):
    trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=4)
    trainer.fit(Net(), loader)
