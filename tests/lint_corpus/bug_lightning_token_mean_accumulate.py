# corpus: style=lightning class=F5
# a padded tagger returns its token mean from training_step; Lightning divides it by
# accumulate_grad_batches: the window's update is the mean of micro-batch means
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

IGNORE = -100


class Tagger(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        self.log("train_loss", loss)
        return loss  # expect: AG104

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(net, loader):
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, accumulate_grad_batches=4)
    trainer.fit(Tagger(net), loader)
