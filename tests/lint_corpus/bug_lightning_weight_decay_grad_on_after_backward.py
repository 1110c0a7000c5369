# corpus: style=lightning class=LOSS_SCALE
# decoupled weight decay written into the gradient in on_after_backward: Lightning calls it
# after every micro-batch, so with accumulate_grad_batches=8 it is added 8 times per update
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self, wd=1e-2):
        super().__init__()
        self.wd = wd
        self.body = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.body(x), y)

    def on_after_backward(self):
        for p in self.parameters():
            if p.grad is not None:
                p.grad += self.wd * p.detach()  # expect: AG369

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


pl.Trainer(max_epochs=2, accumulate_grad_batches=8).fit(Net(), loader)
