# corpus: style=lightning class=OK
# Class weights without accumulation (each batch its own optimizer step).
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def __init__(self, class_w):
        super().__init__()
        self.net = torch.nn.Linear(16, 4)
        self.register_buffer("class_w", class_w)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, weight=self.class_w)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(dm):
    pl.Trainer(max_epochs=1, accumulate_grad_batches=1).fit(Classifier(torch.ones(4)), dm)
