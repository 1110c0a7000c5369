# corpus: style=lightning class=OK
# the saliency is taken with torch.autograd.grad on the inputs: the weights' .grad untouched
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.body(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            (gx,) = torch.autograd.grad(self.body(x).max(-1).values.sum(), x)
            self.log("saliency", gx.abs().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


pl.Trainer(max_epochs=2, accumulate_grad_batches=4, val_check_interval=6).fit(Net(), train, val)
