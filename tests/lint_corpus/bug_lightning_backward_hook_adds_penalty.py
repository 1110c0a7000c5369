# corpus: style=lightning class=LOSS_SCALE
# a backward() override adds an L2 penalty to the loss Lightning hands it; Lightning divided
# that loss by accumulate_grad_batches already, the penalty counts 4 times per update
import lightning.pytorch as pl
import torch


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def backward(self, loss, *args, **kwargs):
        l2 = sum(p.pow(2).sum() for p in self.net.parameters())
        loss += 1e-3 * l2  # expect: AG365
        loss.backward(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


pl.Trainer(max_epochs=1, accumulate_grad_batches=4).fit(Regressor(), loader)
