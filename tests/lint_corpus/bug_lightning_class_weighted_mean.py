# corpus: style=lightning class=F5
# Inverse-frequency class weights in the cross-entropy; Lightning accumulates 4 batches.
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
        return loss  # expect: AG104

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(dm):
    pl.Trainer(max_epochs=1, accumulate_grad_batches=4).fit(Classifier(torch.ones(4)), dm)
